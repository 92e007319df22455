package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ursula-go/ursula/streamcore"
)

// A stream URL may name several nodes of one cluster:
//
//	http://host1:port1,host2:port2,host3:port3/bucket/stream
//
// The client sends each request to one of them: first the first node, later the node that
// last answered for the stream (the leader it named, or the next node after one that
// failed). It never sends anything to a host the URL does not name: a redirect elsewhere is
// refused with a *URLError, and so is a list whose nodes answer different Ursula-Cluster-Ids.

// URLError is a stream URL the client refuses to use: a malformed node list, nodes that
// belong to different clusters, or a redirect to a host the URL does not name. Callers
// report it as an invalid URL: the fix is in the URL, not in retrying.
type URLError struct {
	URL    string
	Reason string
}

func (e *URLError) Error() string { return fmt.Sprintf("stream URL %s: %s", e.URL, e.Reason) }

// Node is one host of a multi-node stream URL.
type Node struct {
	Host string // lowercased, IPv6 without brackets
	Port string // "" when the URL leaves it to the scheme
}

// authority is the node as it is written in a URL.
func (n Node) authority() string {
	h := n.Host
	if strings.Contains(h, ":") {
		h = "[" + h + "]"
	}
	if n.Port != "" {
		h += ":" + n.Port
	}
	return h
}

// Canonical is the node as a stream's identity spells it: the port only when it is not
// the scheme's default.
func (n Node) Canonical(scheme string) string {
	if n.Port == defaultPort(scheme) {
		return Node{Host: n.Host}.authority()
	}
	return n.authority()
}

// key identifies the node for matching: host and port, the default made explicit.
func (n Node) key(scheme string) string {
	p := n.Port
	if p == "" {
		p = defaultPort(scheme)
	}
	return n.Host + "|" + p
}

func defaultPort(scheme string) string {
	if scheme == "https" {
		return "443"
	}
	return "80"
}

// NodeURL is a stream URL split into its nodes and the part after the authority.
type NodeURL struct {
	Scheme string // lowercased
	Nodes  []Node // in the order written: the first is tried first
	Rest   string // path, query and fragment as written ("/bucket/stream")
}

// ParseNodeURL splits a stream URL whose authority lists several nodes. ok is false for
// a URL that names a single host (it needs no node routing); err is a *URLError for a
// malformed list: a node without a host, a port that is not a number from 1 to 65535, a
// node named twice, or user information.
func ParseNodeURL(raw string) (nu *NodeURL, ok bool, err error) {
	scheme, rest, found := strings.Cut(raw, "://")
	if !found {
		return nil, false, nil
	}
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	authority := rest[:end]
	if !strings.Contains(authority, ",") {
		return nil, false, nil
	}
	bad := func(format string, args ...any) (*NodeURL, bool, error) {
		return nil, true, &URLError{URL: raw, Reason: fmt.Sprintf(format, args...)}
	}
	nu = &NodeURL{Scheme: strings.ToLower(scheme), Rest: rest[end:]}
	if nu.Scheme != "http" && nu.Scheme != "https" {
		return bad("a node list needs http:// or https://")
	}
	if strings.Contains(authority, "@") {
		return bad("a node list cannot carry user information (give the token separately)")
	}
	seen := map[string]bool{}
	for i, part := range strings.Split(authority, ",") {
		n, why := parseNode(part)
		if why != "" {
			return bad("node %d (%q) %s", i+1, part, why)
		}
		k := n.key(nu.Scheme)
		if seen[k] {
			return bad("node %s is named twice", n.authority())
		}
		seen[k] = true
		nu.Nodes = append(nu.Nodes, n)
	}
	return nu, true, nil
}

// parseNode reads host[:port] or [ipv6][:port]; why says what is wrong ("" when nothing).
func parseNode(s string) (Node, string) {
	var host, port string
	hasPort := false
	if strings.HasPrefix(s, "[") {
		i := strings.IndexByte(s, ']')
		if i < 0 {
			return Node{}, "has no closing ]"
		}
		host = s[1:i]
		after := s[i+1:]
		switch {
		case after == "":
		case strings.HasPrefix(after, ":"):
			port, hasPort = after[1:], true
		default:
			return Node{}, "has text after ]"
		}
		if !strings.Contains(host, ":") {
			return Node{}, "puts a host that is not an IPv6 address in brackets"
		}
	} else {
		host, port, hasPort = strings.Cut(s, ":")
		if strings.ContainsAny(host, "[]") {
			return Node{}, "has a misplaced bracket"
		}
	}
	if host == "" {
		return Node{}, "has no host"
	}
	for _, r := range host {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-._~%:", r)) {
			return Node{}, fmt.Sprintf("has the character %q in its host", r)
		}
	}
	if hasPort {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 || strings.TrimLeft(port, "0123456789") != "" {
			return Node{}, "has a port that is not a number from 1 to 65535"
		}
		port = strconv.Itoa(n)
	}
	return Node{Host: strings.ToLower(host), Port: port}, ""
}

// At is the URL of the same resource on node i.
func (nu *NodeURL) At(i int) string {
	return nu.Scheme + "://" + nu.Nodes[i].authority() + nu.Rest
}

// Authority is the node list as written in the URL, in the written order.
func (nu *NodeURL) Authority() string {
	a := make([]string, len(nu.Nodes))
	for i, n := range nu.Nodes {
		a[i] = n.authority()
	}
	return strings.Join(a, ",")
}

// CanonicalAuthority is the node list of the stream's identity: each node in its
// canonical spelling, sorted, so the same nodes in another order name the same stream.
func (nu *NodeURL) CanonicalAuthority() string {
	a := make([]string, len(nu.Nodes))
	for i, n := range nu.Nodes {
		a[i] = n.Canonical(nu.Scheme)
	}
	slices.Sort(a)
	return strings.Join(a, ",")
}

// indexOf finds the node a URL (absolute, or relative to node cur) points at; -1 when
// it is none of the list's nodes.
func (nu *NodeURL) indexOf(cur int, loc string) int {
	u, err := url.Parse(loc)
	if err != nil {
		return -1
	}
	if u.Host == "" {
		return cur
	}
	scheme := strings.ToLower(u.Scheme)
	if scheme != nu.Scheme {
		return -1
	}
	k := Node{Host: strings.ToLower(u.Hostname()), Port: u.Port()}.key(scheme)
	for i, n := range nu.Nodes {
		if n.key(nu.Scheme) == k {
			return i
		}
	}
	return -1
}

// SameStream reports whether two stream URLs name the same stream: equal as written, or
// the same node list in another order with the same path.
func SameStream(a, b string) bool {
	if a == b {
		return true
	}
	na, oka, erra := ParseNodeURL(a)
	nb, okb, errb := ParseNodeURL(b)
	if !oka || !okb || erra != nil || errb != nil {
		return false
	}
	return na.Scheme == nb.Scheme && na.Rest == nb.Rest && na.CanonicalAuthority() == nb.CanonicalAuthority()
}

// nodeRoute is what a client learned about one node list: the cluster its nodes belong
// to, which nodes proved it, and which node to try first for each stream.
type nodeRoute struct {
	probeMu sync.Mutex // one first contact at a time

	mu        sync.Mutex
	probed    bool           // the first contact asked every node
	clusterID string         // "" until a node named it
	checked   []bool         // node i answered with clusterID (or with no id at all)
	err       *URLError      // the nodes belong to different clusters: refuse everything
	prefer    map[string]int // stream path -> node to try first
}

// routeFor returns the node routing of a multi-node URL (nil for a single host).
func (c *Client) routeFor(u string) (*nodeRoute, *NodeURL, error) {
	nu, ok, err := ParseNodeURL(u)
	if !ok || err != nil {
		return nil, nil, err
	}
	key := nu.Scheme + "://" + nu.Authority()
	if v, ok := c.routes.Load(key); ok {
		return v.(*nodeRoute), nu, nil
	}
	v, _ := c.routes.LoadOrStore(key, &nodeRoute{checked: make([]bool, len(nu.Nodes)), prefer: map[string]int{}})
	return v.(*nodeRoute), nu, nil
}

// streamKey is the part of the path that names the stream (/bucket/stream): its
// sub-resources (snapshot, bootstrap) share the stream's preferred node.
func streamKey(rest string) string {
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		rest = rest[:i]
	}
	segs := strings.SplitN(strings.TrimPrefix(rest, "/"), "/", 3)
	if len(segs) > 2 {
		segs = segs[:2]
	}
	return strings.Join(segs, "/")
}

// first returns the node to try first for the stream of nu, after the first contact
// checked that the nodes belong to one cluster.
func (rt *nodeRoute) first(ctx context.Context, c *Client, nu *NodeURL) (int, error) {
	rt.probeMu.Lock()
	rt.mu.Lock()
	probed := rt.probed
	rt.mu.Unlock()
	if !probed {
		c.probeAll(ctx, rt, nu)
	}
	rt.probeMu.Unlock()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.err != nil {
		return 0, rt.err
	}
	return rt.prefer[streamKey(nu.Rest)], nil
}

// probeAll asks every node of the list at once (HEAD of the stream) which cluster it
// belongs to. Nodes that do not answer now are checked by the first answer they give.
func (c *Client) probeAll(ctx context.Context, rt *nodeRoute, nu *NodeURL) {
	ids := make([]string, len(nu.Nodes))
	answered := make([]bool, len(nu.Nodes))
	var wg sync.WaitGroup
	for i := range nu.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids[i], answered[i] = c.probe(ctx, nu, i)
		}()
	}
	wg.Wait()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.probed = true
	for i := range nu.Nodes {
		if answered[i] {
			rt.observeLocked(nu, i, ids[i])
		}
	}
}

// probe sends HEAD of the stream to node i and returns the Ursula-Cluster-Id of the
// answer, whatever its status; answered is false when no answer came.
func (c *Client) probe(ctx context.Context, nu *NodeURL, i int) (id string, answered bool) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	rest := nu.Rest
	if j := strings.IndexAny(rest, "?#"); j >= 0 {
		rest = rest[:j]
	}
	u := nu.Scheme + "://" + nu.Nodes[i].authority() + "/" + streamKey(rest)
	req, err := c.newRequest(ctx, http.MethodHead, u, make(http.Header, 2), nil, 0)
	if err != nil {
		return "", false
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return "", false
	}
	resp.Body.Close()
	return resp.Header.Get(streamcore.HdrUrsulaClusterID), true
}

// observe records the cluster id node i answered with; a *URLError when it differs from
// the id other nodes of the list gave.
func (rt *nodeRoute) observe(nu *NodeURL, i int, h http.Header) *URLError {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.observeLocked(nu, i, h.Get(streamcore.HdrUrsulaClusterID))
	return rt.err
}

func (rt *nodeRoute) observeLocked(nu *NodeURL, i int, id string) {
	if rt.err != nil || id == "" {
		rt.checked[i] = rt.checked[i] || id == ""
		return
	}
	if rt.clusterID == "" {
		rt.clusterID = id
	}
	if id != rt.clusterID {
		other := ""
		for j, ok := range rt.checked {
			if ok && j != i {
				other = nu.Nodes[j].authority()
				break
			}
		}
		rt.err = &URLError{URL: nu.Scheme + "://" + nu.Authority() + nu.Rest, Reason: fmt.Sprintf(
			"the nodes belong to different clusters: %s answers Ursula-Cluster-Id %q, %s answers %q; list the nodes of one cluster only",
			nu.Nodes[i].authority(), id, other, rt.clusterID)}
		return
	}
	rt.checked[i] = true
}

// setPreferred makes node i the first tried for nu's stream.
func (rt *nodeRoute) setPreferred(nu *NodeURL, i int) {
	rt.mu.Lock()
	rt.prefer[streamKey(nu.Rest)] = i
	rt.mu.Unlock()
}

// skip moves nu's stream on to the node after i (it failed or knows no leader).
func (rt *nodeRoute) skip(nu *NodeURL, i int) int {
	next := (i + 1) % len(nu.Nodes)
	rt.setPreferred(nu, next)
	return next
}

// isNotLeader reports an answer that says the node does not lead the stream's group:
// the server's NOT_LEADER code or its x-ursula-not-applied: NotLeader marker.
func isNotLeader(status int, h http.Header, code string) bool {
	return (status == http.StatusTemporaryRedirect || status == http.StatusServiceUnavailable) &&
		(code == "NOT_LEADER" || h.Get(streamcore.HdrNotApplied) == "NotLeader")
}

// nodeHops bounds the hops of one request over a node list: every node may fail once
// and redirect once, and a little more.
func nodeHops(nu *NodeURL) int { return 2*len(nu.Nodes) + 2 }
