// Package repocheck holds tests over the repository's source tree itself
// (file sizes, the code docs/architecture.md cites, the Makefile lists
// that run the tagged tests), which belong to no
// one package. It has no code.
package repocheck
