// Package pgcluster starts throwaway PostgreSQL clusters from the server
// binaries on the machine (wal_level=logical, a free 127.0.0.1 port, a
// temporary data directory) and standbys of them, and drives them: stop,
// restart, kill, promote, wait for replay. The demos, the bench and, through
// internal/testenv, the integration tests run against them. It does not
// import the testing package: a missing binary or a failed start is an
// error for the caller to report.
package pgcluster
