package raftengine

import (
	"io"
	"path/filepath"

	"github.com/hashicorp/raft"

	"github.com/ursula-go/ursula/internal/pagecache"
)

// snapshotStore is raft's file snapshot store whose snapshots, once written and synced,
// give their page-cache pages back (internal/pagecache): a group's snapshot holds all of
// its hot bytes (every byte of its streams without a cold tier, as in a cluster by
// default), and the snapshots that keep the journal under its budget rewrite them each
// time. A snapshot is read again only to restore a replica or to send it to a follower.
type snapshotStore struct {
	*raft.FileSnapshotStore
	dir string // the store's base: snapshots live in dir/snapshots/{id}/state.bin
}

func newSnapshotStore(dir string, retain int, logOutput io.Writer) (*snapshotStore, error) {
	s, err := raft.NewFileSnapshotStore(dir, retain, logOutput)
	if err != nil {
		return nil, err
	}
	return &snapshotStore{FileSnapshotStore: s, dir: dir}, nil
}

func (s *snapshotStore) Create(version raft.SnapshotVersion, index, term uint64, configuration raft.Configuration,
	configurationIndex uint64, trans raft.Transport) (raft.SnapshotSink, error) {
	sink, err := s.FileSnapshotStore.Create(version, index, term, configuration, configurationIndex, trans)
	if err != nil {
		return nil, err
	}
	return &snapshotSink{SnapshotSink: sink, dir: s.dir}, nil
}

type snapshotSink struct {
	raft.SnapshotSink
	dir string
}

// Close finishes the snapshot (raft's sink syncs it) and drops its pages.
func (k *snapshotSink) Close() error {
	if err := k.SnapshotSink.Close(); err != nil {
		return err
	}
	pagecache.DropPath(filepath.Join(k.dir, "snapshots", k.ID(), "state.bin"))
	return nil
}
