// Package netproxy holds TCP proxies for tests of the network between the
// relay and its services: Proxy stalls, black-holes, throttles or cuts the
// traffic it forwards, and TLSTerminator terminates TLS in front of a
// plain-text server with certificates from a throwaway CA. It does not
// import the testing package.
package netproxy
