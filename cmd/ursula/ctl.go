package main

// ursula ctl: operate one node through its admin listener. Tables for people, --json for
// scripts; progress of long waits on stderr when it is a terminal; a non-zero exit with a
// one-line reason (the server's error code and message when it refused).

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	raftengine "github.com/ursula-go/ursula/engine/raft"
	"github.com/ursula-go/ursula/server"
	"github.com/ursula-go/ursula/streamcore"
)

const ctlUsage = `Usage: ursula ctl [--node ADMIN_URL] [--json] [--timeout DURATION] COMMAND

--node is the admin listener of the node to operate (default http://127.0.0.1:4438).

Commands:
  status                  groups, their leaders, indexes and recovery gates on this node
  wait-ready              wait until the node answers ready (prints why it is held)
  drain                   set the persistent drain mark and hand away every leadership
  undrain                 clear the drain mark
  transfer GROUP [NODE]   hand the leadership of GROUP (led by this node) to NODE (any voter when omitted)
  members list            every member and its voter/learner groups
  members add ID URL      add node ID (URL: its client URL) as a learner in every group, one
                          group at a time, wait for it to catch up, promote it to voter
  members remove ID       remove node ID from every group
  observe-unsynced-loss   what this node may have lost in an unclean stop (recovery gates)
  accept-unsynced-loss    accept the loss a single node reports: every stream's history is
                          rewritten (new token, producers closed), then it stops reporting it
  purge BUCKET            erase every stream and cold object of BUCKET and fence it for good
                          (later requests answer 404 BUCKET_ERASED); safe to repeat
  usage                   per-bucket appends, bytes in and out, retained and staged bytes
  restart-group GROUP     restart a raft group that stopped applying (after a fix): it
                          replays from its latest snapshot, the failed entry first

Every mutation carries the node's process incarnation (read from its metrics first, or
--incarnation ID), so a node that restarted in between refuses it with 412.

Exit status: 0 on success, 2 on a usage error, 1 otherwise (with a one-line reason).
`

// ctl is one invocation.
type ctl struct {
	node     string
	json     bool
	timeout  time.Duration
	stdout   io.Writer
	stderr   io.Writer
	progress bool // stderr is a terminal
	http     *http.Client
	inc      string // the node's process incarnation, pinned on mutations
}

// ctlError is a refusal by the server: its status and JSON error.
type ctlError struct {
	status  int
	code    string
	message string
}

func (e *ctlError) Error() string {
	if e.code == "" {
		return fmt.Sprintf("HTTP %d: %s", e.status, e.message)
	}
	return fmt.Sprintf("HTTP %d %s: %s", e.status, e.code, e.message)
}

func runCtl(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, ctlUsage) }
	c := &ctl{stdout: stdout, stderr: stderr}
	fs.StringVar(&c.node, "node", "http://127.0.0.1:4438", "admin URL of the node")
	fs.BoolVar(&c.json, "json", false, "print JSON")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Minute, "give up waiting after this long")
	fs.StringVar(&c.inc, "incarnation", "", "the node's process incarnation mutations are pinned to (default: read from its metrics)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 || fs.Arg(0) == "help" {
		fmt.Fprint(stdout, ctlUsage)
		if fs.NArg() == 0 {
			return 2
		}
		return 0
	}
	c.node = strings.TrimRight(c.node, "/")
	c.http = &http.Client{Timeout: time.Minute}
	if f, ok := stderr.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			c.progress = true
		}
	}
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	var err error
	switch {
	case cmd == "status" && len(rest) == 0:
		err = c.status()
	case cmd == "wait-ready" && len(rest) == 0:
		err = c.waitReady()
	case cmd == "drain" && len(rest) == 0:
		err = c.drain()
	case cmd == "undrain" && len(rest) == 0:
		err = c.simple(http.MethodDelete, "/__ursula/leadership-shed/maintenance", "drain mark cleared")
	case cmd == "transfer" && (len(rest) == 1 || len(rest) == 2):
		err = c.transfer(rest)
	case cmd == "members" && len(rest) == 1 && rest[0] == "list":
		err = c.membersList()
	case cmd == "members" && len(rest) == 3 && rest[0] == "add":
		err = c.membersAdd(rest[1], rest[2])
	case cmd == "members" && len(rest) == 2 && rest[0] == "remove":
		err = c.membersRemove(rest[1])
	case cmd == "observe-unsynced-loss" && len(rest) == 0:
		err = c.observeLoss()
	case cmd == "accept-unsynced-loss" && len(rest) == 0:
		err = c.acceptLoss()
	case cmd == "purge" && len(rest) == 1:
		err = c.purge(rest[0])
	case cmd == "usage" && len(rest) == 0:
		err = c.usage()
	case cmd == "restart-group" && len(rest) == 1:
		err = c.restartGroup(rest[0])
	default:
		fmt.Fprintf(stderr, "ursula ctl: unknown command or wrong arguments: %s\n\n%s", strings.Join(fs.Args(), " "), ctlUsage)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "ursula ctl %s: %s\n", cmd, oneLine(err.Error()))
		return 1
	}
	return 0
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// call sends a request; a 2xx answer is decoded into out (when not nil).
func (c *ctl) call(method, rawURL string, out any) error {
	req, err := http.NewRequest(method, rawURL, nil)
	if err != nil {
		return err
	}
	req.Header.Set(server.HdrAdmin, "1") // admin mutations must be explicit
	if method != http.MethodGet && strings.HasPrefix(rawURL, c.node+"/") {
		if c.inc == "" {
			var ms struct {
				Incarnation string `json:"process_incarnation"`
			}
			if err := c.call(http.MethodGet, c.node+"/__ursula/metrics", &ms); err != nil {
				return fmt.Errorf("read the node's process incarnation: %w", err)
			}
			c.inc = ms.Incarnation
		}
		req.Header.Set(server.HdrProcessIncarnation, c.inc)
	}
	res, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	if res.StatusCode/100 != 2 {
		var eb streamcore.ErrorBody
		if json.Unmarshal(b, &eb) == nil && eb.Error.Code != "" {
			return &ctlError{status: res.StatusCode, code: eb.Error.Code, message: eb.Error.Message}
		}
		var ready struct {
			Reason string `json:"reason"`
			Detail string `json:"detail"`
		}
		if json.Unmarshal(b, &ready) == nil && ready.Reason != "" {
			return &ctlError{status: res.StatusCode, code: ready.Reason, message: ready.Detail}
		}
		return &ctlError{status: res.StatusCode, message: strings.TrimSpace(string(b))}
	}
	if out != nil {
		if raw, ok := out.(*json.RawMessage); ok {
			*raw = append((*raw)[:0], b...)
			return nil
		}
		return json.Unmarshal(b, out)
	}
	return nil
}

func (c *ctl) printJSON(raw []byte) {
	var buf bytes.Buffer
	if json.Indent(&buf, raw, "", "  ") != nil {
		buf.Reset()
		buf.Write(raw)
	}
	buf.WriteByte('\n')
	c.stdout.Write(buf.Bytes())
}

// say prints a one-line result for people, or {"ok":true,...} with --json.
func (c *ctl) say(msg string, fields map[string]any) {
	if c.json {
		if fields == nil {
			fields = map[string]any{}
		}
		fields["ok"] = true
		fields["message"] = msg
		b, _ := json.Marshal(fields)
		c.printJSON(b)
		return
	}
	fmt.Fprintln(c.stdout, msg)
}

// note shows progress on a terminal (rewriting one line).
func (c *ctl) note(format string, a ...any) {
	if c.progress {
		fmt.Fprintf(c.stderr, "\r\033[K"+format, a...)
	}
}

func (c *ctl) noteDone() {
	if c.progress {
		fmt.Fprint(c.stderr, "\r\033[K")
	}
}

func (c *ctl) simple(method, path, msg string) error {
	var raw json.RawMessage
	if err := c.call(method, c.node+path, &raw); err != nil {
		return err
	}
	if c.json {
		c.printJSON(raw)
	} else {
		fmt.Fprintln(c.stdout, msg)
	}
	return nil
}

func (c *ctl) raftStatus() (raftengine.Status, error) {
	var st raftengine.Status
	err := c.call(http.MethodGet, c.node+"/__ursula/raft/status", &st)
	return st, err
}

func (c *ctl) status() error {
	var raw json.RawMessage
	if err := c.call(http.MethodGet, c.node+"/__ursula/raft/status", &raw); err != nil {
		return err
	}
	if c.json {
		c.printJSON(raw)
		return nil
	}
	var st raftengine.Status
	if err := json.Unmarshal(raw, &st); err != nil {
		return err
	}
	ready := "ready"
	if err := c.call(http.MethodGet, c.node+"/__ursula/ready", nil); err != nil {
		ready = "not ready: " + err.Error()
	}
	fmt.Fprintf(c.stdout, "node %d  %s  leads %d of %d groups  drain mark %v  %s\n", st.NodeID, st.URL, st.Leading, st.GroupCount, st.DrainMark, ready)
	fmt.Fprintf(c.stdout, "raft log %d of budget %d bytes (pressure %v)  leader balancer %v\n\n", st.RaftLogBytes, st.RaftLogBudget, st.RaftLogPressure, st.Balancer)
	tw := tabwriter.NewWriter(c.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tSTATE\tLEADER\tTERM\tLAST\tCOMMIT\tAPPLIED\tLAG\tGATE\tSTREAMS\tAPPLY")
	for _, g := range st.Groups {
		lag := uint64(0)
		if g.CommitIndex > g.AppliedIndex {
			lag = g.CommitIndex - g.AppliedIndex
		}
		apply := "running"
		if f := g.ApplyFailure; f != nil {
			apply = fmt.Sprintf("STOPPED at %d (%s: %s)", f.Index, f.Kind, oneLine(f.Message))
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%s\n", g.Group, g.State, g.LeaderID, g.Term, g.LastIndex, g.CommitIndex, g.AppliedIndex, lag, g.RecoveryGate, g.Streams, apply)
	}
	return tw.Flush()
}

func (c *ctl) waitReady() error {
	deadline := time.Now().Add(c.timeout)
	for {
		err := c.call(http.MethodGet, c.node+"/__ursula/ready", nil)
		if err == nil {
			c.noteDone()
			c.say("ready", nil)
			return nil
		}
		if time.Now().After(deadline) {
			c.noteDone()
			return fmt.Errorf("not ready after %v: %w", c.timeout, err)
		}
		c.note("waiting: %s", oneLine(err.Error()))
		time.Sleep(250 * time.Millisecond)
	}
}

func (c *ctl) drain() error {
	if err := c.call(http.MethodPost, c.node+"/__ursula/leadership-shed/maintenance", nil); err != nil {
		return err
	}
	deadline := time.Now().Add(c.timeout)
	for {
		st, err := c.raftStatus()
		if err == nil && st.Leading == 0 {
			c.noteDone()
			c.say(fmt.Sprintf("node %d drained: it leads no group and keeps the drain mark until undrain", st.NodeID), map[string]any{"node_id": st.NodeID})
			return nil
		}
		if time.Now().After(deadline) {
			c.noteDone()
			return fmt.Errorf("the node still leads %d groups after %v", st.Leading, c.timeout)
		}
		c.note("node %d still leads %d groups", st.NodeID, st.Leading)
		time.Sleep(250 * time.Millisecond)
	}
}

func (c *ctl) transfer(args []string) error {
	q := url.Values{"group": {args[0]}}
	if len(args) == 2 {
		q.Set("to", args[1])
	}
	return c.simple(http.MethodPost, "/__ursula/raft/transfer?"+q.Encode(), "leadership of group "+args[0]+" handed over")
}

func (c *ctl) members() (raftengine.Membership, json.RawMessage, error) {
	var raw json.RawMessage
	var m raftengine.Membership
	if err := c.call(http.MethodGet, c.node+"/__ursula/members", &raw); err != nil {
		return m, nil, err
	}
	return m, raw, json.Unmarshal(raw, &m)
}

func (c *ctl) membersList() error {
	m, raw, err := c.members()
	if err != nil {
		return err
	}
	if c.json {
		c.printJSON(raw)
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tURL\tRAFT_ADDR\tVOTER_GROUPS\tLEARNER_GROUPS")
	for _, n := range m.Nodes {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d/%d\t%d\n", n.NodeID, n.URL, n.RaftAddr, n.VoterGroups, m.GroupCount, n.LearnerGroups)
	}
	return tw.Flush()
}

// retry repeats op while the cluster is in transition (no leader yet, a leadership or
// configuration change in flight) until the timeout.
func (c *ctl) retry(what string, deadline time.Time, op func() error) error {
	for {
		err := op()
		if err == nil {
			return nil
		}
		var ce *ctlError
		transient := !errors.As(err, &ce) || ce.status == http.StatusServiceUnavailable ||
			(ce.status == http.StatusConflict && (strings.Contains(ce.message, "not the leader") || strings.Contains(ce.message, "leadership") || strings.Contains(ce.message, "configuration")))
		if !transient || time.Now().After(deadline) {
			return fmt.Errorf("%s: %w", what, err)
		}
		c.note("%s: retrying (%s)", what, oneLine(err.Error()))
		time.Sleep(300 * time.Millisecond)
	}
}

func (c *ctl) membersAdd(idArg, nodeURL string) error {
	id, err := strconv.ParseUint(idArg, 10, 64)
	if err != nil || id == 0 {
		return fmt.Errorf("node id %q: a non-zero number", idArg)
	}
	nodeURL = strings.TrimRight(nodeURL, "/")
	// The new node tells its id and cluster address on its client listener.
	var nm struct {
		Raft raftengine.Status `json:"raft"`
	}
	if err := c.call(http.MethodGet, nodeURL+"/__ursula/metrics", &nm); err != nil {
		return fmt.Errorf("new node at %s: %w", nodeURL, err)
	}
	if nm.Raft.NodeID != id {
		return fmt.Errorf("the node at %s has node id %d, not %d", nodeURL, nm.Raft.NodeID, id)
	}
	if nm.Raft.RaftAddr == "" {
		return fmt.Errorf("the node at %s reports no cluster address (start it with server.cluster_listen and --join)", nodeURL)
	}
	local, err := c.raftStatus()
	if err != nil {
		return err
	}
	if nm.Raft.GroupCount != local.GroupCount {
		return fmt.Errorf("the node at %s has %d groups, the cluster %d", nodeURL, nm.Raft.GroupCount, local.GroupCount)
	}
	deadline := time.Now().Add(c.timeout)
	q := url.Values{"url": {nodeURL}, "raft_addr": {nm.Raft.RaftAddr}}
	for g := 0; g < local.GroupCount; g++ {
		what := fmt.Sprintf("group %d/%d", g+1, local.GroupCount)
		if err := c.retry(what+": add learner", deadline, func() error {
			return c.call(http.MethodPost, fmt.Sprintf("%s/__ursula/raft/%d/learners/%d?%s", c.node, g, id, q.Encode()), nil)
		}); err != nil {
			return err
		}
		// Catch-up: the learner applies what was committed when it was added.
		st, err := c.raftStatus()
		if err != nil {
			return err
		}
		target := st.Groups[g].CommitIndex
		for last := uint64(0); ; {
			var m struct {
				Raft raftengine.Status `json:"raft"`
			}
			err := c.call(http.MethodGet, nodeURL+"/__ursula/metrics", &m)
			if err == nil && g < len(m.Raft.Groups) {
				applied := m.Raft.Groups[g].AppliedIndex
				if applied >= target {
					break
				}
				if applied != last {
					last = applied
					deadline = time.Now().Add(c.timeout) // progress-gated: never time out while advancing
				}
				c.note("%s: learner applied %d of %d", what, applied, target)
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: the learner did not catch up within %v (applied %d of %d)", what, c.timeout, last, target)
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err := c.retry(what+": promote", deadline, func() error {
			return c.call(http.MethodPost, fmt.Sprintf("%s/__ursula/raft/%d/voters/%d", c.node, g, id), nil)
		}); err != nil {
			return err
		}
		c.note("%s: node %d is a voter", what, id)
	}
	c.noteDone()
	c.say(fmt.Sprintf("node %d (%s) is a voter in all %d groups", id, nodeURL, local.GroupCount), map[string]any{"node_id": id, "groups": local.GroupCount})
	return nil
}

func (c *ctl) membersRemove(idArg string) error {
	id, err := strconv.ParseUint(idArg, 10, 64)
	if err != nil || id == 0 {
		return fmt.Errorf("node id %q: a non-zero number", idArg)
	}
	local, err := c.raftStatus()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(c.timeout)
	for g := 0; g < local.GroupCount; g++ {
		what := fmt.Sprintf("group %d/%d", g+1, local.GroupCount)
		c.note("%s: removing node %d", what, id)
		if err := c.retry(what+": remove", deadline, func() error {
			return c.call(http.MethodDelete, fmt.Sprintf("%s/__ursula/raft/%d/members/%d", c.node, g, id), nil)
		}); err != nil {
			return err
		}
	}
	c.noteDone()
	c.say(fmt.Sprintf("node %d removed from all %d groups", id, local.GroupCount), map[string]any{"node_id": id, "groups": local.GroupCount})
	return nil
}

func (c *ctl) printRecovery(raw []byte) error {
	if c.json {
		c.printJSON(raw)
		return nil
	}
	var r raftengine.Recovery
	if err := json.Unmarshal(raw, &r); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "node %d  unclean stop %v  host restarted %v  unsynced loss possible %v\n\n", r.NodeID, r.UncleanStop, r.HostRestart, r.UnsyncedLossPossible)
	tw := tabwriter.NewWriter(c.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tGATE\tLAST_LOG_INDEX\tLAST_LOG_TERM\tCURRENT_TERM\tAPPLIED\tREFUSED_VOTES")
	for _, g := range r.Groups {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%d\t%d\n", g.Group, g.Gate, g.LastLogIndex, g.LastLogTerm, g.CurrentTerm, g.AppliedIndex, g.RefusedVotes)
	}
	return tw.Flush()
}

func (c *ctl) observeLoss() error {
	var raw json.RawMessage
	if err := c.call(http.MethodGet, c.node+"/__ursula/recovery", &raw); err != nil {
		return err
	}
	return c.printRecovery(raw)
}

func (c *ctl) acceptLoss() error {
	var raw json.RawMessage
	if err := c.call(http.MethodPost, c.node+"/__ursula/recovery/accept-unsynced-loss", &raw); err != nil {
		return err
	}
	return c.printRecovery(raw)
}

func (c *ctl) restartGroup(arg string) error {
	g, err := strconv.ParseUint(arg, 10, 64)
	if err != nil {
		return fmt.Errorf("GROUP must be a group number, not %q", arg)
	}
	var rep raftengine.GroupRestart
	var raw json.RawMessage
	if err := c.call(http.MethodPost, fmt.Sprintf("%s/__ursula/raft/%d/restart", c.node, g), &raw); err != nil {
		return err
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		return err
	}
	if c.json {
		c.printJSON(raw)
	} else if rep.Outcome == "resumed" {
		fmt.Fprintf(c.stdout, "group %d resumed: replayed %d entries after snapshot %d, applied index %d\n", g, rep.Replayed, rep.FromSnapshot, rep.AppliedIndex)
	}
	if rep.Outcome != "resumed" {
		msg := "still stopped"
		if f := rep.Failure; f != nil {
			msg = fmt.Sprintf("still stopped at index %d (%s: %s)", f.Index, f.Kind, f.Message)
		}
		return fmt.Errorf("group %d %s", g, msg)
	}
	return nil
}
