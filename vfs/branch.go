package vfs

import (
	"context"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
)

// Point is the commit (or snapshot) a branch, an export or a verify was made at: its
// stream offset and what the log says about it (time, size, epoch).
type Point = replicator.Point

// Branch creates the database stream dst as a writable copy of the database at src as it
// was at: "" for now, a commit offset, an RFC 3339 time (the last commit at or before
// it) or a relative time such as "-10m". It is a fork of src's stream on the server, so
// nothing is copied there; open it like any database (Open(dst, ...)), which claims the
// branch for its own owner. The source and its owner are not touched. dst must not exist
// yet and must be on the same server as src. Branch returns the commit it branched at.
func Branch(ctx context.Context, src, at, dst string) (Point, error) {
	c, err := client.New("")
	if err != nil {
		return Point{}, err
	}
	return replicator.Branch(ctx, c, src, at, dst, streamcore.MaxRequestBytes)
}
