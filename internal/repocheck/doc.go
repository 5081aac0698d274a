// Package repocheck holds tests over the repository's source tree itself
// (file sizes, the code docs/architecture.md cites, the Makefile lists
// that run the tagged tests, no broker feature RabbitMQ 4.3 refuses as
// deprecated), which belong to no one package. It has no code.
package repocheck
