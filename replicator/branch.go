package replicator

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/streamcore"
)

// Branch makes the stream at dst a fork of the database stream at src as of at (an "as
// of" for History.Resolve: "" is the tail). The server shares the source's bytes up to
// the fork point instead of copying them, and the branch then lives on its own: whoever
// opens it claims it with its own epoch and incarnation, and the source's owner is not
// disturbed (a fork writes nothing to its source).
//
// A fork starts with its source's retention. When the source has dropped the log below
// its snapshot, the branch could not be rebuilt from its own stream, so the source's
// snapshot (at or below the fork point) is published on the branch too: the only bytes
// Branch moves, through this client.
func Branch(ctx context.Context, c *client.Client, src, at, dst string, maxFrame int) (Point, error) {
	for _, u := range []string{src, dst} {
		if err := CheckURL(u); err != nil {
			return Point{}, err
		}
	}
	su, _ := url.Parse(src)
	du, _ := url.Parse(dst)
	if su.Scheme != du.Scheme || su.Host != du.Host {
		return Point{}, newError(KindInvalidArg, ActionFix, nil, "a branch lives on the same server as its source: %s and %s differ", su.Host, du.Host)
	}
	h, err := ReadHistory(ctx, c, src, maxFrame, nil)
	if err != nil {
		return Point{}, err
	}
	p, err := h.Resolve(at, time.Now())
	if err != nil {
		return Point{}, err
	}
	hdr := http.Header{}
	hdr.Set(streamcore.HdrForkedFrom, su.EscapedPath())
	hdr.Set(streamcore.HdrForkOffset, streamcore.FormatOffset(p.Offset))
	if _, err := c.Create(ctx, dst, client.CreateOptions{ContentType: "application/octet-stream", Header: hdr}); err != nil {
		var ce *client.Error
		if errors.As(err, &ce) && ce.Status == http.StatusConflict {
			return Point{}, newError(KindNotApplied, ActionFix, err, "%s already exists; a branch is always a new stream", dst)
		}
		return Point{}, classifyRead(err, "creating the branch")
	}
	if h.Retained > 0 {
		if err := copySnapshot(ctx, c, src, dst, h.Snapshot.Offset); err != nil {
			return Point{}, err
		}
	}
	return p, nil
}

// copySnapshot publishes the source's snapshot at off on the branch.
func copySnapshot(ctx context.Context, c *client.Client, src, dst string, off uint64) error {
	tok := streamcore.FormatOffset(off)
	sr, err := c.ReadSnapshot(ctx, src, tok)
	if err != nil {
		return classifyRead(err, "reading the source's snapshot for the branch")
	}
	if _, err := c.PublishSnapshot(ctx, dst, tok, sr.ContentType, sr.Data); err != nil {
		return classifyRead(err, "publishing the snapshot on the branch")
	}
	return nil
}
