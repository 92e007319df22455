package replicator

import (
	"context"
	"os"

	"github.com/ursula-go/ursula/client"
)

// ReplayLog writes to dst the database as a replay of the stream's records in [0, to)
// leaves it, ignoring any snapshot: an independent second rebuild to check a snapshot
// against. The stream must still retain its whole log (retention at 0). dst is written
// in place; on error it holds a partial image.
func ReplayLog(ctx context.Context, c *client.Client, url, dst string, to uint64, maxFrame int) (*Image, error) {
	info, err := c.Head(ctx, url)
	if err != nil {
		return nil, classifyRead(err, "HEAD of the stream")
	}
	if info.RetainedOffset != "" && info.RetainedOffset != "00000000000000000000" {
		return nil, newError(KindNotFound, ActionFix, nil, "the stream no longer retains its whole log (retention at %s)", info.RetainedOffset)
	}
	f, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	img := &Image{}
	if err := replay(ctx, c, url, f, img, 0, to, maxFrame, nil); err != nil {
		return nil, err
	}
	if err := f.Truncate(int64(img.DBPages) * int64(img.PageSize)); err != nil {
		return nil, err
	}
	return img, nil
}
