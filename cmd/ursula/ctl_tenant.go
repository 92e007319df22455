package main

// ursula ctl purge and usage: tenant offboarding and per-bucket usage, through the admin
// listener.

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/ursula-go/ursula/server"
)

// purge erases a bucket, retrying while a group has no leader (the purge is idempotent).
// It fails unless the answer proves nothing of the bucket is left.
func (c *ctl) purge(bucket string) error {
	var raw json.RawMessage
	err := c.retry("purge", time.Now().Add(c.timeout), func() error {
		return c.call(http.MethodDelete, c.node+"/__ursula/purge/"+url.PathEscape(bucket), &raw)
	})
	c.noteDone()
	if err != nil {
		return err
	}
	var a server.PurgeAnswer
	if err := json.Unmarshal(raw, &a); err != nil {
		return fmt.Errorf("purge answer: %w", err)
	}
	if c.json {
		c.printJSON(raw)
	} else {
		fmt.Fprintf(c.stdout, "bucket %s erased: %d streams removed, %d cold objects deleted, %d remain\n",
			a.Bucket, a.RemovedStreams, a.ColdObjectsDeleted, a.ColdObjectsRemaining)
	}
	switch {
	case a.ColdError != nil:
		return fmt.Errorf("incomplete: %s", *a.ColdError)
	case a.StreamsHeldByForks > 0:
		return fmt.Errorf("incomplete: %d streams stay while forks in other buckets read through them; delete those forks and purge again", a.StreamsHeldByForks)
	case !a.Complete:
		return fmt.Errorf("incomplete: %d cold objects remain (a read or another node still uses them); purge again later", a.ColdObjectsRemaining)
	}
	return nil
}

// usage prints the per-bucket usage of the node.
func (c *ctl) usage() error {
	var raw json.RawMessage
	if err := c.call(http.MethodGet, c.node+"/__ursula/usage", &raw); err != nil {
		return err
	}
	if c.json {
		c.printJSON(raw)
		return nil
	}
	var u server.Usage
	if err := json.Unmarshal(raw, &u); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BUCKET\tSTREAMS\tAPPENDS\tBYTES IN\tBYTES OUT\tRETAINED\tSTAGED PARTS\t")
	for _, b := range slices.Sorted(maps.Keys(u.Buckets)) {
		x := u.Buckets[b]
		name := b
		if x.Erased {
			name += " (erased)"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t\n", name, x.Streams, x.Appends, x.BytesIn, x.BytesOut, x.RetainedBytes, x.StagedPartBytes)
	}
	return tw.Flush()
}
