package store

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Config is the [storage.cold] section of the server config.
type Config struct {
	// Backend is "none" (default: no cold tier), "fs" or "s3".
	Backend string `toml:"backend"`
	// Root is a key prefix for every cold object (spec storage.cold.root).
	Root string `toml:"root"`
	// Dir is the directory of the fs backend.
	Dir string `toml:"dir"`
	// FlushInterval is the flush worker tick (default 1s).
	FlushInterval Duration `toml:"flush_interval"`
	// FlushSize is the hot bytes per group that start a flush, and the target (maximum)
	// size of one chunk object (default 8MiB).
	FlushSize Size `toml:"flush_size"`
	// FlushMaxHotAge: a stream whose hot start has not moved for this long is flushed
	// whole even when its group is below flush_size (default 5m; "0s" disables).
	FlushMaxHotAge *Duration `toml:"flush_max_hot_age"`
	// FlushMaxConcurrency bounds parallel chunk uploads (default 4).
	FlushMaxConcurrency int `toml:"flush_max_concurrency"`
	// MaxHotSizePerGroup: above it, appends and creates with a body answer 503
	// ColdBackpressure (default 64MiB; "0" disables). A pointer tells "0" from absent.
	MaxHotSizePerGroup *Size `toml:"max_hot_size_per_group"`
	// BackpressureWait: a write that finds its group over max_hot_size_per_group waits up
	// to this long for the flusher to bring the group under it before it is refused
	// (default 1s; "0s" refuses at once; at most 1m).
	BackpressureWait *Duration `toml:"backpressure_wait"`
	// CacheSize bounds the cache of recently read cold ranges (default 64MiB; 0 = default).
	CacheSize Size `toml:"cache_size"`
	// GCInterval is how often unreferenced objects are looked for (default 1m).
	GCInterval Duration `toml:"gc_interval"`
	// GCGrace is how long an object stays after it stopped being referenced (default 5m).
	GCGrace Duration `toml:"gc_grace"`
	// PartsGrace is how long a staged snapshot part no commit used stays before the
	// collector reclaims it (default 24h).
	PartsGrace Duration `toml:"parts_grace"`
	// SnapshotMinSize: snapshot bodies at or above it are stored as objects (default 1MiB;
	// spec runtime.external_payload_min_size).
	SnapshotMinSize Size `toml:"snapshot_min_size"`

	S3 S3Config `toml:"s3"`
}

// S3Config is the [storage.cold.s3] section.
type S3Config struct {
	Bucket          string `toml:"bucket"`
	Region          string `toml:"region"`
	Endpoint        string `toml:"endpoint"`
	Prefix          string `toml:"prefix"`
	AccessKeyID     string `toml:"access_key_id"`
	SecretAccessKey string `toml:"secret_access_key"`
	SessionToken    string `toml:"session_token"`
	// ServerSideEncryption is "aes256" (default), "aws-kms" or "none".
	ServerSideEncryption string `toml:"server_side_encryption"`
	KMSKeyID             string `toml:"kms_key_id"`
	// ForcePathStyle addresses the bucket in the path; defaults to true with an endpoint.
	ForcePathStyle *bool `toml:"force_path_style"`
	// Timeout bounds one request (default none beyond the caller's deadline).
	Timeout Duration `toml:"timeout"`
	// MaxRetries is the SDK's retry count (default: the SDK's, 3).
	MaxRetries int `toml:"max_retries"`
}

// Defaults used when a field is zero.
const (
	DefaultFlushInterval       = time.Second
	DefaultFlushSize           = 8 << 20
	DefaultFlushMaxConcurrency = 4
	DefaultFlushMaxHotAge      = 5 * time.Minute
	DefaultMaxHotSizePerGroup  = 64 << 20
	DefaultBackpressureWait    = time.Second
	maxBackpressureWait        = time.Minute
	DefaultCacheSize           = 64 << 20
	DefaultGCInterval          = time.Minute
	DefaultGCGrace             = 5 * time.Minute
	DefaultPartsGrace          = 24 * time.Hour
	DefaultSnapshotMinSize     = 1 << 20
)

// Enabled reports whether a cold tier is configured.
func (c *Config) Enabled() bool { return c.Backend != "" && c.Backend != "none" }

// HotCap is the per-group hot ceiling in bytes (0 = no cap).
func (c *Config) HotCap() int64 {
	if c.MaxHotSizePerGroup == nil {
		return DefaultMaxHotSizePerGroup
	}
	return int64(*c.MaxHotSizePerGroup)
}

// HotCapWait is backpressure_wait: how long a write over the hot cap waits for the
// flusher before it is refused (0: refused at once).
func (c *Config) HotCapWait() time.Duration {
	if c.BackpressureWait == nil {
		return DefaultBackpressureWait
	}
	return c.BackpressureWait.D()
}

// MaxHotAge is flush_max_hot_age (0 = disabled).
func (c *Config) MaxHotAge() time.Duration {
	if c.FlushMaxHotAge == nil {
		return DefaultFlushMaxHotAge
	}
	return c.FlushMaxHotAge.D()
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Backend == "" {
		c.Backend = "none"
	}
	if c.FlushInterval == 0 {
		c.FlushInterval = Duration(DefaultFlushInterval)
	}
	if c.FlushSize == 0 {
		c.FlushSize = DefaultFlushSize
	}
	if c.FlushMaxConcurrency == 0 {
		c.FlushMaxConcurrency = DefaultFlushMaxConcurrency
	}
	if c.CacheSize == 0 {
		c.CacheSize = DefaultCacheSize
	}
	if c.GCInterval == 0 {
		c.GCInterval = Duration(DefaultGCInterval)
	}
	if c.GCGrace == 0 {
		c.GCGrace = Duration(DefaultGCGrace)
	}
	if c.PartsGrace == 0 {
		c.PartsGrace = Duration(DefaultPartsGrace)
	}
	if c.SnapshotMinSize == 0 {
		c.SnapshotMinSize = DefaultSnapshotMinSize
	}
	return c
}

// Validate says what to fix in a [storage.cold] section.
func (c *Config) Validate() error {
	switch c.Backend {
	case "", "none":
		return nil
	case "fs":
		if c.Dir == "" {
			return fmt.Errorf(`storage.cold.dir is required when cold backend is 'fs' (a local directory for cold objects)`)
		}
	case "s3":
		if err := c.S3.Validate(); err != nil {
			return err
		}
	default:
		return fmt.Errorf(`storage.cold.backend %q is not supported: use "none", "fs" or "s3"`, c.Backend)
	}
	if c.FlushMaxConcurrency < 0 {
		return fmt.Errorf("storage.cold.flush_max_concurrency must be positive")
	}
	if c.FlushSize < 0 || c.FlushSize > 1<<30 {
		return fmt.Errorf("storage.cold.flush_size must be between 1 byte and 1GiB")
	}
	if c.MaxHotSizePerGroup != nil && *c.MaxHotSizePerGroup != 0 && c.FlushSize != 0 && *c.MaxHotSizePerGroup < c.FlushSize {
		return fmt.Errorf("storage.cold.max_hot_size_per_group (%d bytes) must be at least storage.cold.flush_size (%d bytes), or 0 to disable the cap", *c.MaxHotSizePerGroup, c.FlushSize)
	}
	if w := c.HotCapWait(); w < 0 || w > maxBackpressureWait {
		return fmt.Errorf("storage.cold.backpressure_wait %v must be between 0s (refuse at once) and %v", w, maxBackpressureWait)
	}
	if strings.HasPrefix(c.Root, "/") || strings.Contains(c.Root, "..") {
		return fmt.Errorf("storage.cold.root %q must be a relative key prefix without '..'", c.Root)
	}
	return nil
}

// Validate says what to fix in a [storage.cold.s3] section.
func (c *S3Config) Validate() error {
	if c.Bucket == "" {
		return fmt.Errorf("storage.cold.s3.bucket is required when cold backend is 's3'")
	}
	if (c.AccessKeyID == "") != (c.SecretAccessKey == "") {
		return fmt.Errorf("storage.cold.s3.access_key_id and secret_access_key go together: set both, or neither to use the AWS credential chain")
	}
	if c.SessionToken != "" && c.AccessKeyID == "" {
		return fmt.Errorf("storage.cold.s3.session_token needs access_key_id and secret_access_key")
	}
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("storage.cold.s3.endpoint %q must be an http:// or https:// URL, e.g. http://127.0.0.1:9000", c.Endpoint)
		}
	}
	switch strings.ToLower(c.ServerSideEncryption) {
	case "", "aes256", "none":
		if c.KMSKeyID != "" {
			return fmt.Errorf("storage.cold.s3.kms_key_id is only valid with server_side_encryption = \"aws-kms\"")
		}
	case "aws-kms":
	default:
		return fmt.Errorf("storage.cold.s3.server_side_encryption %q: use \"aes256\", \"aws-kms\" or \"none\" (MinIO without KMS needs \"none\")", c.ServerSideEncryption)
	}
	if c.MaxRetries < 0 {
		return fmt.Errorf("storage.cold.s3.max_retries must not be negative")
	}
	return nil
}

// Open builds the store of a validated config (nil for backend none).
func Open(ctx context.Context, c Config) (Store, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	switch c.Backend {
	case "fs":
		return NewFS(c.Dir)
	case "s3":
		return NewS3(ctx, c.S3)
	}
	return nil, nil
}

// Size is a byte count written as an integer or a string with a unit ("8MiB", "512KiB",
// "1GiB", "64MB").
type Size int64

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *Size) UnmarshalText(b []byte) error {
	v, err := ParseSize(string(b))
	if err != nil {
		return err
	}
	*s = Size(v)
	return nil
}

// UnmarshalTOML accepts integers as well as strings.
func (s *Size) UnmarshalTOML(v any) error {
	switch x := v.(type) {
	case int64:
		if x < 0 {
			return fmt.Errorf("size %d is negative", x)
		}
		*s = Size(x)
		return nil
	case string:
		return s.UnmarshalText([]byte(x))
	}
	return fmt.Errorf("size must be an integer or a string like \"8MiB\", not %T", v)
}

// ParseSize parses "123", "8MiB", "4 KiB", "1GB".
func ParseSize(text string) (int64, error) {
	t := strings.TrimSpace(text)
	i := 0
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, fmt.Errorf("size %q: want a number with an optional unit (B, KiB, MiB, GiB, KB, MB, GB)", text)
	}
	n, err := strconv.ParseInt(t[:i], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: %v", text, err)
	}
	mult := int64(1)
	switch strings.ToLower(strings.TrimSpace(t[i:])) {
	case "", "b":
	case "kib", "k":
		mult = 1 << 10
	case "mib", "m":
		mult = 1 << 20
	case "gib", "g":
		mult = 1 << 30
	case "kb":
		mult = 1000
	case "mb":
		mult = 1000 * 1000
	case "gb":
		mult = 1000 * 1000 * 1000
	default:
		return 0, fmt.Errorf("size %q: unknown unit; use B, KiB, MiB, GiB, KB, MB or GB", text)
	}
	return n * mult, nil
}

// Duration is a time.Duration written as "1s", "200ms", "5m".
type Duration time.Duration

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("duration %q: use a Go duration such as \"1s\", \"200ms\" or \"5m\"", string(b))
	}
	if v < 0 {
		return fmt.Errorf("duration %q is negative", string(b))
	}
	*d = Duration(v)
	return nil
}

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }
