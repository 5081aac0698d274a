// Package repocheck holds tests over the repository's source tree itself
// (file sizes, every name docs/architecture.md cites, resolved exactly
// with go/parser, docs/testing.md's list of leak checks, the Makefile lists
// that run the tagged tests, no broker feature RabbitMQ 4.3 refuses as
// deprecated, cmd/ holding only shipped binaries, none of which links the
// testing package), which belong to no one package. It has no code.
package repocheck
