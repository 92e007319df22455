package main

import (
	"context"
	"encoding/csv"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
	"github.com/ursula-go/ursula/vfs"
)

const sqlUsage = `Usage: ursula sql <stream-url> "QUERY" [--at OFFSET|TIME] [--json|--csv]

Runs QUERY on the replicated database held by the stream, read-only and without a local
copy: only the pages the query touches are fetched (from the latest snapshot's frames and
the commits after it). At the tail, or as it was at OFFSET (a stream offset at a commit
boundary the stream still retains). Prints a table, or JSON (an array of objects) or CSV
with a header row. Blobs print as hex.
`

func runSQL(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sql", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, sqlUsage) }
	at := fs.String("at", "", "stream offset or time to query at (default: the tail)")
	asJSON := fs.Bool("json", false, "print the rows as a JSON array of objects")
	asCSV := fs.Bool("csv", false, "print the rows as CSV with a header row")
	var pos []string
	for len(args) > 0 { // flags may follow the positional arguments
		if err := fs.Parse(args); err != nil {
			return err
		}
		args = fs.Args()
		if len(args) > 0 {
			pos = append(pos, args[0])
			args = args[1:]
		}
	}
	if len(pos) != 2 {
		fs.Usage()
		return fmt.Errorf("need a stream URL and a query")
	}
	if *asJSON && *asCSV {
		return fmt.Errorf("--json and --csv exclude each other")
	}
	url, query := pos[0], pos[1]
	if err := replicator.CheckURL(url); err != nil {
		return err
	}
	offset, err := resolveAt(context.Background(), url, *at, stderr)
	if err != nil {
		return err
	}
	db, err := vfs.Open(url, vfs.Options{ReadOnly: true, Lazy: true, At: offset})
	if err != nil {
		return err
	}
	defer db.Close()
	rows, err := db.Query(query)
	if err != nil {
		return err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return err
	}
	var table [][]any
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return err
		}
		table = append(table, vals)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	switch {
	case *asJSON:
		return printJSON(stdout, cols, table)
	case *asCSV:
		return printCSV(stdout, cols, table)
	}
	return printTable(stdout, cols, table)
}

// resolveAt reads --at: "" is the tail; a stream offset (the 20-digit form or a plain
// number) is taken as given; anything else (an RFC 3339 time, "-10m") is resolved through
// the stream's history to the last commit at or before it, which is named on stderr.
func resolveAt(ctx context.Context, url, s string, stderr io.Writer) (uint64, error) {
	if s == "" {
		return 0, nil
	}
	if o, err := streamcore.ParseOffset(s); err == nil {
		return o, nil
	}
	if o, err := strconv.ParseUint(s, 10, 64); err == nil {
		return o, nil
	}
	c, err := client.New("")
	if err != nil {
		return 0, err
	}
	h, err := replicator.ReadHistory(ctx, c, url, streamcore.MaxRequestBytes, nil)
	if err != nil {
		return 0, err
	}
	p, err := h.Resolve(s, time.Now())
	if err != nil {
		return 0, fmt.Errorf("--at %s: %w", s, err)
	}
	fmt.Fprintf(stderr, "as of %s\n", describePoint(p))
	return p.Offset, nil
}

// text renders a value for the table and CSV; null says how NULL looks.
func text(v any, null string) string {
	switch x := v.(type) {
	case nil:
		return null
	case []byte:
		if utf8.Valid(x) {
			return string(x)
		}
		return "x'" + hex.EncodeToString(x) + "'"
	case time.Time:
		return x.Format(time.RFC3339Nano)
	}
	return fmt.Sprint(v)
}

func printTable(w io.Writer, cols []string, table [][]any) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(cols, "\t"))
	dashes := make([]string, len(cols))
	for i, c := range cols {
		dashes[i] = strings.Repeat("-", max(len(c), 1))
	}
	fmt.Fprintln(tw, strings.Join(dashes, "\t"))
	for _, row := range table {
		cells := make([]string, len(row))
		for i, v := range row {
			cells[i] = strings.NewReplacer("\t", " ", "\n", " ").Replace(text(v, "NULL"))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

func printCSV(w io.Writer, cols []string, table [][]any) error {
	cw := csv.NewWriter(w)
	cw.Write(cols)
	for _, row := range table {
		cells := make([]string, len(row))
		for i, v := range row {
			cells[i] = text(v, "")
		}
		cw.Write(cells)
	}
	cw.Flush()
	return cw.Error()
}

func printJSON(w io.Writer, cols []string, table [][]any) error {
	out := make([]map[string]any, 0, len(table))
	for _, row := range table {
		obj := make(map[string]any, len(cols))
		for i, v := range row {
			if b, ok := v.([]byte); ok {
				v = text(b, "")
			}
			obj[cols[i]] = v
		}
		out = append(out, obj)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
