package svckit

import (
	"fmt"
	"net"
)

// PortAttempts bounds retries when the free port a starter picked was taken
// by someone else between probing it and the server binding it.
const PortAttempts = 5

// FreePort asks the kernel for an unused 127.0.0.1 port. Another process
// may grab it before the caller binds it: retry up to PortAttempts times.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	return port, nil
}
