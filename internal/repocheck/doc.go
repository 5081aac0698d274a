// Package repocheck holds tests over the repository's source tree itself
// (file sizes), which belong to no one package. It has no code.
package repocheck
