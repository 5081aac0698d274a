// Package config reads the relay's configuration from CDCRELAY_* environment
// variables and validates it, reporting every bad value on a line of its own.
package config

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/sethvargo/go-envconfig"
)

// Prefix is the prefix of every environment variable the relay reads.
const Prefix = "CDCRELAY_"

// Config is the relay's configuration. Field tags name the variables
// (without Prefix) and their defaults; docs/configuration.md documents each
// one (TestConfigurationDoc holds it to these tags).
type Config struct {
	DatabaseURL     string `env:"DATABASE_URL"`
	DatabaseURLFile string `env:"DATABASE_URL_FILE"`
	// ReplicationURL, when set, puts the replication connection and the
	// slot on a physical standby of DATABASE_URL's primary (PostgreSQL
	// 16+), so the primary does no logical decoding.
	ReplicationURL     string `env:"REPLICATION_URL"`
	ReplicationURLFile string `env:"REPLICATION_URL_FILE"`
	AMQPURL            string `env:"AMQP_URL"`
	AMQPURLFile        string `env:"AMQP_URL_FILE"`
	AMQPTLSCA          string `env:"AMQP_TLS_CA"`   // PEM file with the CA(s) that sign the broker's certificate
	AMQPTLSCert        string `env:"AMQP_TLS_CERT"` // PEM client certificate, for brokers that require one
	AMQPTLSKey         string `env:"AMQP_TLS_KEY"`  // PEM key of the client certificate
	// AMQPManagementURL is the RabbitMQ management API, read by check only:
	// AMQP cannot list bindings, queue arguments or policies.
	AMQPManagementURL string `env:"AMQP_MANAGEMENT_URL"`

	Exchange string `env:"EXCHANGE, default=events"`
	// Table is the outbox table as configured, in SQL syntax (quoted parts
	// allowed); SplitTable reads it into real names.
	Table string `env:"TABLE, default=public.event_outbox"`
	// Publication and the column names below are SQL identifiers as
	// configured; Load replaces them by their real names (quotes removed,
	// unquoted ones folded to lower case).
	Publication string `env:"PUBLICATION, default=cdcrelay_outbox"`
	Slot        string `env:"SLOT, default=cdcrelay_outbox"`
	HTTPAddr    string `env:"HTTP_ADDR, default=:8080"`

	IDColumn         string `env:"ID_COLUMN, default=id"`
	RoutingKeyColumn string `env:"ROUTING_KEY_COLUMN, default=routing_key"`
	PayloadColumn    string `env:"PAYLOAD_COLUMN, default=payload"`
	HeadersColumn    string `env:"HEADERS_COLUMN, default=headers"`
	ExchangeColumn   string `env:"EXCHANGE_COLUMN, default=exchange"`
	TypeColumn       string `env:"TYPE_COLUMN, default=event_type"`

	MaxInFlight      int           `env:"MAX_IN_FLIGHT, default=1000"`
	PublishChannels  int           `env:"PUBLISH_CHANNELS, default=1"`
	MaxInFlightBytes ByteSize      `env:"MAX_IN_FLIGHT_BYTES, default=16MiB"`
	ConfirmTimeout   time.Duration `env:"CONFIRM_TIMEOUT, default=30s"`
	StatusInterval   time.Duration `env:"STATUS_INTERVAL, default=10s"`
	ShutdownTimeout  time.Duration `env:"SHUTDOWN_TIMEOUT, default=15s"`
	BackoffMin       time.Duration `env:"BACKOFF_MIN, default=500ms"`
	BackoffMax       time.Duration `env:"BACKOFF_MAX, default=30s"`
	AMQPHeartbeat    time.Duration `env:"AMQP_HEARTBEAT, default=10s"`

	MarkInterval      time.Duration `env:"MARK_INTERVAL, default=500ms"`
	MarkBatch         int           `env:"MARK_BATCH, default=1000"`
	Retention         Duration      `env:"RETENTION, default=7d"`
	RetentionInterval Duration      `env:"RETENTION_INTERVAL, default=1h"`
	RetentionBatch    int           `env:"RETENTION_BATCH, default=5000"`
	MonitorInterval   time.Duration `env:"MONITOR_INTERVAL, default=15s"`
	StandbyRetry      time.Duration `env:"STANDBY_RETRY, default=2s"` // only for a slot held outside the slot lock: a standby waits on the lock, it never polls
	SlotLost          string        `env:"SLOT_LOST, default=recreate"`
	SlotFailover      string        `env:"SLOT_FAILOVER, default=auto"`
	MarkOrigin        string        `env:"MARK_ORIGIN, default=auto"`
	LockDatabase      string        `env:"LOCK_DATABASE, default=postgres"` // where the slot lock is held and waited for

	Poison             string   `env:"POISON, default=park"`
	Unroutable         string   `env:"UNROUTABLE, default=stall"`
	DeadLetterExchange string   `env:"DEAD_LETTER_EXCHANGE"`
	MaxMessageBytes    ByteSize `env:"MAX_MESSAGE_BYTES, default=16MiB"`

	LogLevel  string `env:"LOG_LEVEL, default=info"`
	LogFormat string `env:"LOG_FORMAT, default=text"`
}

// Error lists every problem found in the configuration, one per line.
type Error struct{ Problems []string }

func (e *Error) Error() string { return strings.Join(e.Problems, "\n") }

// Load reads the configuration from the process environment.
func Load(ctx context.Context) (Config, error) {
	return LoadFrom(ctx, envconfig.OsLookuper())
}

// LoadFrom reads the configuration through l, which sees variable names with
// Prefix. Every problem is reported in one error, one line each naming its
// variable: a value that does not decode, a secret file that cannot be read,
// a value that decodes but makes no sense. A value that does not decode is
// left at its default for the later checks, so one bad value neither hides
// the next nor is reported twice.
func LoadFrom(ctx context.Context, l envconfig.Lookuper) (Config, error) {
	var problems []string
	good := map[string]string{}
	for _, key := range keys() {
		v, ok := l.Lookup(Prefix + key)
		if !ok {
			continue
		}
		var probe Config
		err := envconfig.ProcessWith(ctx, &envconfig.Config{
			Target:   &probe,
			Lookuper: envconfig.MapLookuper(map[string]string{key: v}),
		})
		if err != nil {
			if inner := errors.Unwrap(err); inner != nil {
				err = inner
			}
			problems = append(problems, fmt.Sprintf("%s%s: %v", Prefix, key, err))
			continue
		}
		good[key] = v
	}
	var c Config
	if err := envconfig.ProcessWith(ctx, &envconfig.Config{Target: &c, Lookuper: envconfig.MapLookuper(good)}); err != nil {
		problems = append(problems, err.Error())
	}
	problems = append(problems, c.resolveFiles()...)
	problems = append(problems, c.validate()...)
	if p := firstPerVariable(problems); len(p) > 0 {
		return Config{}, &Error{Problems: p}
	}
	c.resolveNames()
	return c, nil
}

// firstPerVariable keeps the first problem reported for each variable (a
// URL and its _FILE counting as one), in the order of Config's fields: a
// variable whose value did not decode, or whose file could not be read, is
// checked again at its default or empty value, and that second finding
// ("required", "must be positive") would only mislead.
func firstPerVariable(problems []string) []string {
	order := map[string]int{}
	for i, k := range keys() {
		order[Prefix+k] = i
	}
	variable := func(p string) string {
		end := strings.IndexAny(p, ": ")
		if end < 0 {
			return p
		}
		return strings.TrimSuffix(p[:end], "_FILE")
	}
	seen := map[string]bool{}
	var out []string
	for _, p := range problems {
		v := variable(p)
		if seen[v] {
			continue
		}
		seen[v] = true
		out = append(out, p)
	}
	slices.SortStableFunc(out, func(a, b string) int {
		ia, oka := order[variable(a)]
		ib, okb := order[variable(b)]
		if !oka {
			ia = len(order)
		}
		if !okb {
			ib = len(order)
		}
		return ia - ib
	})
	return out
}

// name is a configured SQL identifier.
type name struct {
	key      string // variable name without Prefix
	value    *string
	optional bool // empty means "not used"
}

// names lists the identifiers other than the table (SplitTable reads it).
func (c *Config) names() []name {
	return []name{
		{"PUBLICATION", &c.Publication, false},
		{"ID_COLUMN", &c.IDColumn, false}, {"ROUTING_KEY_COLUMN", &c.RoutingKeyColumn, false}, {"PAYLOAD_COLUMN", &c.PayloadColumn, false},
		{"HEADERS_COLUMN", &c.HeadersColumn, true}, {"EXCHANGE_COLUMN", &c.ExchangeColumn, true}, {"TYPE_COLUMN", &c.TypeColumn, true},
	}
}

// resolveNames replaces the publication and column identifiers, as
// configured (quoted or not), by their real names once, after Validate:
// the rest of the relay compares them with catalog and pgoutput names and
// quotes them again with pgx.Identifier. The table stays as configured;
// SplitTable reads it.
func (c *Config) resolveNames() {
	for _, n := range c.names() {
		if real, err := ParseIdent(*n.value); err == nil {
			*n.value = real
		}
	}
}

// keys lists the variable names (without Prefix) of Config's fields.
func keys() []string {
	t := reflect.TypeFor[Config]()
	out := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		tag := t.Field(i).Tag.Get("env")
		out = append(out, strings.TrimSpace(strings.SplitN(tag, ",", 2)[0]))
	}
	return out
}

// resolveFiles reads secrets given as files (mounted Kubernetes secrets)
// and returns one problem per file that could not be used.
func (c *Config) resolveFiles() []string {
	var problems []string
	read := func(name string, value *string, file string) {
		if file == "" {
			return
		}
		if *value != "" {
			problems = append(problems, fmt.Sprintf("%s%s and %s%s_FILE are both set; set one", Prefix, name, Prefix, name))
			return
		}
		b, err := os.ReadFile(file)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s%s_FILE: %v", Prefix, name, err))
			return
		}
		*value = strings.TrimSpace(string(b))
	}
	read("DATABASE_URL", &c.DatabaseURL, c.DatabaseURLFile)
	read("REPLICATION_URL", &c.ReplicationURL, c.ReplicationURLFile)
	read("AMQP_URL", &c.AMQPURL, c.AMQPURLFile)
	return problems
}

var slotRe = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// Validate checks values that decode but make no sense. Messages never
// include a secret.
func (c *Config) Validate() error {
	if p := c.validate(); len(p) > 0 {
		return &Error{Problems: p}
	}
	return nil
}

// validate returns one problem per bad value, each naming its variable:
// the connections and names, then the limits, then the choices.
func (c *Config) validate() []string {
	var p problems
	c.validateConnections(&p)
	c.validateLimits(&p)
	c.validateChoices(&p)
	return p
}

// problems collects what validate finds, one line per bad value.
type problems []string

// bad adds a problem with the variable named key.
func (p *problems) bad(key, format string, args ...any) {
	*p = append(*p, fmt.Sprintf("%s%s: %s", Prefix, key, fmt.Sprintf(format, args...)))
}

// validateConnections checks the URLs, TLS files, table, slot, listen
// address and the other names.
func (c *Config) validateConnections(p *problems) {
	if c.DatabaseURL == "" {
		p.bad("DATABASE_URL", "required (or set %sDATABASE_URL_FILE)", Prefix)
	} else if _, err := pgconn.ParseConfig(c.DatabaseURL); err != nil {
		p.bad("DATABASE_URL", "not a valid PostgreSQL connection string")
	}
	if c.ReplicationURL != "" {
		if _, err := pgconn.ParseConfig(c.ReplicationURL); err != nil {
			p.bad("REPLICATION_URL", "not a valid PostgreSQL connection string")
		}
		if c.SlotFailover == SlotFailoverOn {
			p.bad("SLOT_FAILOVER", "on with %sREPLICATION_URL: the slot is on a standby, and PostgreSQL refuses failover for a slot created on a standby; set it to auto or off", Prefix)
		}
	}
	*p = append(*p, c.checkAMQPURL()...) // one node or several (amqpnodes.go)
	if c.AMQPManagementURL != "" {
		if u, err := url.Parse(c.AMQPManagementURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			p.bad("AMQP_MANAGEMENT_URL", "want http://user:password@host:15672 or https://…")
		}
	}
	if (c.AMQPTLSCert == "") != (c.AMQPTLSKey == "") {
		p.bad("AMQP_TLS_CERT", "set together with %sAMQP_TLS_KEY", Prefix)
	}
	if c.AMQPTLSCA != "" || c.AMQPTLSCert != "" {
		if _, err := c.AMQPTLS(); err != nil {
			p.bad("AMQP_TLS_CA", "%v", err)
		}
	}
	if _, _, err := SplitTable(c.Table); err != nil {
		p.bad("TABLE", "%v", err)
	}
	if !slotRe.MatchString(c.Slot) {
		p.bad("SLOT", "%q: slot names are 1 to 63 of a-z, 0-9 and _", c.Slot)
	} else if err := CheckSlotName(c.Slot); err != nil {
		p.bad("SLOT", "%v", err)
	}
	if err := checkListenAddr(c.HTTPAddr); err != nil {
		p.bad("HTTP_ADDR", "%v", err)
	}
	if c.LockDatabase == "" {
		p.bad("LOCK_DATABASE", "must not be empty (the database the relay holds and waits for the slot lock in, postgres by default)")
	}
	for _, n := range c.names() {
		if *n.value == "" && n.optional {
			continue
		}
		if _, err := ParseIdent(*n.value); err != nil {
			p.bad(n.key, "%v", err)
		}
	}
}

// validateLimits checks the numbers and durations.
func (c *Config) validateLimits(p *problems) {
	if c.MaxInFlight < 1 || c.MaxInFlight > 65535 {
		p.bad("MAX_IN_FLIGHT", "%d is outside 1..65535", c.MaxInFlight)
	}
	if c.PublishChannels < 1 || c.PublishChannels > 64 {
		p.bad("PUBLISH_CHANNELS", "%d is outside 1..64", c.PublishChannels)
	}
	if c.MaxInFlightBytes < 1024 {
		p.bad("MAX_IN_FLIGHT_BYTES", "%d bytes is below 1KiB", c.MaxInFlightBytes)
	}
	positive := map[string]time.Duration{
		"CONFIRM_TIMEOUT": c.ConfirmTimeout, "STATUS_INTERVAL": c.StatusInterval,
		"SHUTDOWN_TIMEOUT": c.ShutdownTimeout, "BACKOFF_MIN": c.BackoffMin, "BACKOFF_MAX": c.BackoffMax,
		"MARK_INTERVAL": c.MarkInterval, "RETENTION": time.Duration(c.Retention),
		"RETENTION_INTERVAL": time.Duration(c.RetentionInterval), "MONITOR_INTERVAL": c.MonitorInterval,
		"STANDBY_RETRY": c.StandbyRetry,
	}
	for key, d := range positive {
		if d <= 0 {
			p.bad(key, "must be positive")
		}
	}
	if c.BackoffMax < c.BackoffMin {
		p.bad("BACKOFF_MAX", "%s is below %sBACKOFF_MIN (%s)", c.BackoffMax, Prefix, c.BackoffMin)
	}
	if c.MarkBatch < 1 || c.MarkBatch > 100000 {
		p.bad("MARK_BATCH", "%d is outside 1..100000", c.MarkBatch)
	}
	if c.RetentionBatch < 1 || c.RetentionBatch > 1000000 {
		p.bad("RETENTION_BATCH", "%d is outside 1..1000000", c.RetentionBatch)
	}
}

// validateChoices checks the settings that take one of a few values.
func (c *Config) validateChoices(p *problems) {
	if c.SlotLost != SlotLostRecreate && c.SlotLost != SlotLostStop {
		p.bad("SLOT_LOST", "%q: want %s or %s", c.SlotLost, SlotLostRecreate, SlotLostStop)
	}
	if c.SlotFailover != SlotFailoverAuto && c.SlotFailover != SlotFailoverOn && c.SlotFailover != SlotFailoverOff {
		p.bad("SLOT_FAILOVER", "%q: want %s, %s or %s", c.SlotFailover, SlotFailoverAuto, SlotFailoverOn, SlotFailoverOff)
	}
	if c.MarkOrigin != MarkOriginAuto && c.MarkOrigin != MarkOriginOff {
		p.bad("MARK_ORIGIN", "%q: want %s or %s", c.MarkOrigin, MarkOriginAuto, MarkOriginOff)
	}
	if c.Poison != PoisonPark && c.Poison != PoisonStop {
		p.bad("POISON", "%q: want %s or %s", c.Poison, PoisonPark, PoisonStop)
	}
	if c.Unroutable != UnroutableStall && c.Unroutable != UnroutablePark {
		p.bad("UNROUTABLE", "%q: want %s or %s", c.Unroutable, UnroutableStall, UnroutablePark)
	}
	if c.MaxMessageBytes < 1 {
		p.bad("MAX_MESSAGE_BYTES", "must be positive")
	}
	if len(c.DeadLetterExchange) > 255 {
		p.bad("DEAD_LETTER_EXCHANGE", "longer than 255 bytes")
	}
	if c.AMQPHeartbeat < 0 {
		p.bad("AMQP_HEARTBEAT", "must not be negative")
	}
	if _, err := c.Level(); err != nil {
		p.bad("LOG_LEVEL", "%v", err)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		p.bad("LOG_FORMAT", "%q: want text or json", c.LogFormat)
	}
}

// AMQPTLS builds the TLS configuration for amqps:// from the CA and client
// certificate files; nil when none is set (the system roots are used).
func (c *Config) AMQPTLS() (*tls.Config, error) {
	if c.AMQPTLSCA == "" && c.AMQPTLSCert == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.AMQPTLSCA != "" {
		pem, err := os.ReadFile(c.AMQPTLSCA)
		if err != nil {
			return nil, fmt.Errorf("read CA file: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s holds no PEM certificate", c.AMQPTLSCA)
		}
	}
	if c.AMQPTLSCert != "" {
		pair, err := tls.LoadX509KeyPair(c.AMQPTLSCert, c.AMQPTLSKey)
		if err != nil {
			return nil, fmt.Errorf("load client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// RequireBroker reports a missing broker URL; migrate works without one.
func (c *Config) RequireBroker() error {
	if c.AMQPURL == "" {
		return &Error{Problems: []string{Prefix + "AMQP_URL: required (or set " + Prefix + "AMQP_URL_FILE)"}}
	}
	return nil
}

// Level parses LogLevel.
func (c *Config) Level() (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(c.LogLevel))
	return l, err
}

// Duration is a time.Duration that also accepts days, as in "7d" or "1d12h".
type Duration time.Duration

// EnvDecode implements envconfig.Decoder.
func (d *Duration) EnvDecode(v string) error {
	v = strings.TrimSpace(v)
	var days int64
	if i := strings.IndexByte(v, 'd'); i > 0 {
		if _, err := fmt.Sscanf(v[:i], "%d", &days); err != nil || fmt.Sprint(days) != v[:i] || days < 0 {
			return fmt.Errorf("%q is not a duration (want e.g. 7d, 36h or 90m)", v)
		}
		v = v[i+1:]
	}
	var rest time.Duration
	if v != "" {
		var err error
		if rest, err = time.ParseDuration(v); err != nil {
			return fmt.Errorf("%q is not a duration (want e.g. 7d, 36h or 90m)", v)
		}
	}
	*d = Duration(time.Duration(days)*24*time.Hour + rest)
	return nil
}

// ByteSize is a size in bytes written as 1048576, 512KiB, 16MiB or 1GiB.
type ByteSize int64

// EnvDecode implements envconfig.Decoder.
func (b *ByteSize) EnvDecode(v string) error {
	units := []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}, {"", 1}}
	for _, u := range units {
		num, ok := strings.CutSuffix(strings.TrimSpace(v), u.suffix)
		if !ok {
			continue
		}
		var n int64
		if _, err := fmt.Sscanf(num, "%d", &n); err != nil || fmt.Sprint(n) != strings.TrimSpace(num) || n < 0 {
			return fmt.Errorf("%q is not a size (want e.g. 16MiB, 512KiB or a number of bytes)", v)
		}
		*b = ByteSize(n * u.mult)
		return nil
	}
	return fmt.Errorf("%q is not a size", v)
}
