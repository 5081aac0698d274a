package brokernode

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// RabbitMQConfigEnv holds rabbitmq.conf settings every private node gets,
// as "key = value" pairs separated by ";" (or newlines): what a broker
// version needs that another would refuse as an unknown key, such as RabbitMQ
// 4.3's deprecated_features.permit.* (make test-rabbitmq4 sets upstream's
// defaults that Debian's package relaxes). A test's own Config wins.
const RabbitMQConfigEnv = "CDCRELAY_RABBITMQ_CONFIG"

// writeConfig writes the node's rabbitmq.conf: this package's defaults,
// then $CDCRELAY_RABBITMQ_CONFIG, then the test's own Config.
func (r *RabbitMQ) writeConfig() error {
	settings := map[string]string{
		"listeners.tcp.default": "127.0.0.1:" + strconv.Itoa(r.port),
		// A busy /tmp must not trip the disk alarm and block publishers.
		"disk_free_limit.absolute": "1MB",
		"log.file.level":           "info",
		"log.console":              "false",
	}
	extra, err := envRabbitMQConfig()
	if err != nil {
		return err
	}
	for k, v := range extra {
		settings[k] = v
	}
	for k, v := range r.config {
		settings[k] = v
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("# written by cdcrelay internal/svckit/brokernode\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "%s = %s\n", k, settings[k])
	}
	return os.WriteFile(filepath.Join(r.dir, "rabbitmq.conf"), []byte(b.String()), 0o600)
}

// envRabbitMQConfig parses $CDCRELAY_RABBITMQ_CONFIG (RabbitMQConfigEnv).
func envRabbitMQConfig() (map[string]string, error) {
	return parseRabbitMQConfig(os.Getenv(RabbitMQConfigEnv))
}

// parseRabbitMQConfig reads "key = value" pairs separated by ";" or
// newlines; blank entries are ignored, an entry without "=" is an error.
func parseRabbitMQConfig(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, entry := range strings.FieldsFunc(s, func(r rune) bool { return r == ';' || r == '\n' }) {
		if strings.TrimSpace(entry) == "" {
			continue
		}
		k, v, ok := strings.Cut(entry, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" || v == "" {
			return nil, fmt.Errorf("%s: %q is not \"key = value\"", RabbitMQConfigEnv, strings.TrimSpace(entry))
		}
		out[k] = v
	}
	return out, nil
}

// SetConfig changes one rabbitmq.conf setting of a stopped node; the node
// reads it when it starts next (Start). A restart is how an operator
// changes what RabbitMQ 4.x reads only at boot, such as max_message_size.
func (r *RabbitMQ) SetConfig(key, value string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reapLocked()
	if r.proc != nil {
		return fmt.Errorf("set %s: node %s is running; Stop it first", key, r.node)
	}
	config := make(map[string]string, len(r.config)+1)
	for k, v := range r.config {
		config[k] = v
	}
	config[key] = value
	r.config = config
	return r.writeConfig()
}
