package main

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/ursula-go/ursula/engine"
	raftengine "github.com/ursula-go/ursula/engine/raft"
	"github.com/ursula-go/ursula/server"
)

func TestColdConfig(t *testing.T) {
	const text = `
[storage.cold]
backend = "fs"
root = "r"
flush_interval = "200ms"
flush_size = "4MiB"
flush_max_concurrency = 2
flush_max_hot_age = "0s"
max_hot_size_per_group = 0
cache_size = "16MiB"
gc_interval = "30s"
gc_grace = "2m"
parts_grace = "36h"
snapshot_min_size = 1048576
[storage.cold.s3]
bucket = "b"
region = "eu-west-1"
endpoint = "http://127.0.0.1:9000"
prefix = "p"
access_key_id = "k"
secret_access_key = "s"
server_side_encryption = "none"
force_path_style = true
`
	var fc fileConfig
	md, err := toml.Decode(text, &fc)
	if err != nil {
		t.Fatal(err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		t.Fatalf("undecoded keys: %v", und)
	}
	c := fc.Storage.Cold
	if c.FlushSize != 4<<20 || c.HotCap() != 0 || c.MaxHotAge() != 0 || c.FlushInterval.D() != 200*time.Millisecond ||
		c.S3.Bucket != "b" || c.S3.ForcePathStyle == nil || !*c.S3.ForcePathStyle || c.SnapshotMinSize != 1<<20 ||
		c.PartsGrace.D() != 36*time.Hour {
		t.Fatalf("decoded %+v", c)
	}
	data := t.TempDir()
	srv := server.New(engine.NewMemory(0), server.Config{ClusterID: "c"})
	if err := enableCold(srv, &fc.Storage, data, "memory", 0, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	srv.StopCold()
	if _, err := os.Stat(filepath.Join(data, "cold", "r", "URSULA_FORMAT_EPOCH")); err != nil {
		t.Fatalf("fs cold dir not defaulted under the data dir: %v", err)
	}
	bad := fileConfig{}
	bad.Storage.Cold.Backend = "s3"
	err = enableCold(srv, &bad.Storage, data, "memory", 0, slog.Default())
	if err == nil || !strings.Contains(err.Error(), "storage.cold.s3.bucket is required when cold backend is 's3'") {
		t.Fatalf("missing bucket: %v", err)
	}
	if _, err := toml.Decode("[storage.cold]\nflush_size = \"8 parsecs\"\n", &fileConfig{}); err == nil || !strings.Contains(err.Error(), "unknown unit") {
		t.Fatalf("bad size: %v", err)
	}
}

// TestColdDefaults: with no storage.cold.backend, a single raft voter runs the fs cold
// tier under DATA/cold; a raft cluster and the memory engine run none; "none" turns it off.
func TestColdDefaults(t *testing.T) {
	for _, c := range []struct {
		engine string
		voters int
		want   string
	}{{"raft", 0, "fs"}, {"raft", 1, "fs"}, {"raft", 3, "none"}, {"memory", 0, "none"}} {
		if got := defaultColdBackend(c.engine, c.voters); got != c.want {
			t.Errorf("default backend for %s with %d voters: %q, want %q", c.engine, c.voters, got, c.want)
		}
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	e, err := raftengine.Open(raftengine.Config{NodeID: 1, RaftLog: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, c := range []struct {
		backend string
		voters  int
		want    string
	}{{"", 0, "fs"}, {"none", 0, "none"}, {"", 3, "none"}} {
		data := t.TempDir()
		srv := server.New(e, server.Config{ClusterID: "c"})
		var sc storageConfig
		sc.Cold.Backend = c.backend
		if err := enableCold(srv, &sc, data, "raft", c.voters, quiet); err != nil {
			t.Fatalf("backend %q: %v", c.backend, err)
		}
		got := srv.ColdStats().Backend
		srv.StopCold()
		if got != c.want {
			t.Fatalf("backend %q with %d voters runs %q, want %q", c.backend, c.voters, got, c.want)
		}
		_, err := os.Stat(filepath.Join(data, "cold", "URSULA_FORMAT_EPOCH"))
		if (err == nil) != (c.want == "fs") {
			t.Fatalf("backend %q: fs marker under DATA/cold: %v", c.backend, err)
		}
	}
}
