// Package brokernode starts private RabbitMQ nodes and clusters (its own
// port, data directory and Erlang cookie, optionally with the management
// plugin) that a caller can stop, kill, freeze or reconfigure, and holds the
// client helpers used against any broker, the shared one included: the
// broker's URL, a dial with deadlines, exchange and queue set-up, a
// recording consumer that survives broker restarts, and a stream reader.
// It does not import the testing package; internal/testenv wraps it for
// tests.
package brokernode
