package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"

	coldstore "github.com/ursula-go/ursula/coldtier/store"
	"github.com/ursula-go/ursula/server"
)

// storageConfig is the [storage] section of the config file:
//
//	[storage.cold]
//	backend = "fs"                 # "fs", "s3" or "none"; default: "fs" for a single
//	                               # raft voter, "none" for a raft cluster (its nodes need
//	                               # one shared store) and for the memory engine
//	root = "ursula-prod"           # key prefix of every cold object
//	dir = "./ursula-data/cold"     # fs backend (default: DATA/cold)
//	flush_interval = "1s"          # and at once when a write finds flush_size hot
//	flush_size = "8MiB"            # per-group flush threshold and chunk object size
//	flush_max_concurrency = 4
//	flush_max_hot_age = "5m"       # flush a stream whose hot tail is this old; "0s" disables
//	max_hot_size_per_group = "64MiB"   # 503 ColdBackpressure above it; 0 disables
//	backpressure_wait = "1s"       # a write over the cap waits this long for the flush first
//	cache_size = "64MiB"           # LRU of recently read cold blocks
//	gc_interval = "1m"
//	gc_grace = "5m"
//	parts_grace = "24h"            # staged snapshot parts no commit used are deleted after it
//	snapshot_min_size = "1MiB"     # snapshot bodies at least this large are objects
//
//	[storage.cold.s3]
//	bucket = "my-bucket"           # required with backend = "s3"
//	region = "us-east-1"
//	endpoint = "http://127.0.0.1:9000"   # S3-compatible stores; path-style by default
//	prefix = ""
//	access_key_id = "..."          # omit both keys to use the AWS credential chain
//	secret_access_key = "..."
//	server_side_encryption = "aes256"    # or "aws-kms" (kms_key_id) or "none"
type storageConfig struct {
	Cold coldstore.Config `toml:"cold"`
}

// defaultColdBackend is storage.cold.backend when the config leaves it out: "fs" under
// DATA/cold for a single raft voter; "none" for the memory
// engine (its streams do not survive a restart, their objects would only pile up) and for
// a raft cluster, whose voters must share one store (s3, or fs on a shared directory),
// which a per-node default directory is not.
func defaultColdBackend(engine string, voters int) string {
	if engine == "raft" && voters <= 1 {
		return "fs"
	}
	return "none"
}

// enableCold opens the configured cold store and attaches it to srv (nothing for
// backend "none"). The caller defers srv.StopCold().
func enableCold(srv *server.Server, sc *storageConfig, dataDir, engine string, voters int, logger *slog.Logger) error {
	cfg := sc.Cold
	if cfg.Backend == "" {
		cfg.Backend = defaultColdBackend(engine, voters)
	}
	if cfg.Backend == "fs" && cfg.Dir == "" {
		cfg.Dir = filepath.Join(dataDir, "cold")
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if !cfg.Enabled() {
		return nil
	}
	store, err := coldstore.Open(context.Background(), cfg)
	if err != nil {
		return fmt.Errorf("cold store: %w", err)
	}
	if err := srv.EnableCold(store, cfg, server.ColdOptions{}); err != nil {
		return fmt.Errorf("cold store: %w", err)
	}
	if voters > 1 && cfg.Backend == "fs" {
		logger.Warn("cold tier: with several voters, storage.cold.dir must be one directory every node shares (followers read what leaders flushed)", "dir", cfg.Dir)
	}
	logger.Info("cold tier enabled", "backend", cfg.Backend, "root", cfg.Root, "dir", cfg.Dir, "bucket", cfg.S3.Bucket, "endpoint", cfg.S3.Endpoint)
	return nil
}
