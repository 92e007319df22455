// Package faultproxy is an HTTP proxy for tests that sits between a client and a real
// stream server and answers chosen requests with faults: refusals before or after the
// server applied the request, marked or not as not applied, a dropped answer, a request
// body cut midway, a delay, and a request held back and delivered after the next one
// (a reordered retry). Requests it is not told to fault pass through unchanged.
package faultproxy

import (
	"bytes"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// Kind is what the proxy does with one request.
type Kind int

const (
	Forward      Kind = iota // pass it on and relay the answer
	RefuseBefore             // answer Status without passing it on: the server applied nothing
	RefuseAfter              // pass it on (the server applies it), then answer Status instead
	DropBefore               // close the connection without passing it on
	DropAfter                // pass it on, then close the connection without an answer
	CutBody                  // pass on half of the body, close both connections
	Delay                    // wait Fault.Delay, then pass it on
	Hold                     // close the connection; pass the request on after the next forwarded one
)

func (k Kind) String() string {
	return [...]string{"forward", "refuse-before", "refuse-after", "drop-before", "drop-after", "cut-body", "delay", "hold"}[k]
}

// Fault is the proxy's treatment of one request.
type Fault struct {
	Kind   Kind
	Status int           // RefuseBefore, RefuseAfter
	Marked bool          // the refusal carries x-ursula-not-applied and x-ursula-not-applied-checked
	Delay  time.Duration // Delay
}

func (f Fault) String() string {
	switch f.Kind {
	case RefuseBefore, RefuseAfter:
		return fmt.Sprintf("%s %d marked=%t", f.Kind, f.Status, f.Marked)
	case Delay:
		return fmt.Sprintf("delay %v", f.Delay)
	}
	return f.Kind.String()
}

// IsCommit matches appends of an idempotent producer above its claim (Producer-Seq > 0).
func IsCommit(r *http.Request) bool {
	seq := r.Header.Get("Producer-Seq")
	return r.Method == http.MethodPost && seq != "" && seq != "0"
}

// Mixed returns a Choose function that faults about one matched request in three with a
// fault drawn from rng: every kind, refusals with a status of statuses (marked or not when
// refused before the server saw the request), delays under 5 ms. A refusal after the server
// applied the request is never marked: a vouched marker on an applied write breaks the rule
// the marker stands for (tests of that lie script it on purpose). The proxy calls the
// function under its lock, so rng needs no lock of its own.
func Mixed(rng *rand.Rand, statuses []int) func(*http.Request) Fault {
	return func(*http.Request) Fault {
		if rng.Intn(3) != 0 {
			return Fault{}
		}
		switch k := Kind(rng.Intn(8)); k {
		case RefuseBefore:
			return Fault{Kind: k, Status: statuses[rng.Intn(len(statuses))], Marked: rng.Intn(2) == 0}
		case RefuseAfter:
			return Fault{Kind: k, Status: statuses[rng.Intn(len(statuses))]}
		case Delay:
			return Fault{Kind: k, Delay: time.Duration(rng.Intn(5)) * time.Millisecond}
		default:
			return Fault{Kind: k}
		}
	}
}

// Counts says how many matched requests got each kind of fault, as "kind=n" words.
func (p *Proxy) Counts() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b bytes.Buffer
	for k := Forward; k <= Hold; k++ {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%d", k, p.counts[k])
	}
	return b.String()
}

// Proxy is a running fault proxy.
type Proxy struct {
	URL    string // the proxy's base URL, to use in place of the server's
	target *url.URL
	ts     *httptest.Server
	client *http.Client

	mu     sync.Mutex
	match  func(*http.Request) bool
	choose func(*http.Request) Fault
	script []Fault
	held   *heldRequest
	counts map[Kind]int
}

type heldRequest struct {
	method, uri string
	header      http.Header
	body        []byte
}

// New starts a proxy in front of target (a base URL such as http://127.0.0.1:4437). By
// default it faults the requests IsCommit matches, following Script.
func New(target string) (*Proxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: u, match: IsCommit, counts: map[Kind]int{},
		client: &http.Client{Transport: &http.Transport{DisableCompression: true}, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	p.ts = httptest.NewServer(http.HandlerFunc(p.serve))
	p.URL = p.ts.URL
	return p, nil
}

// Close stops the proxy; a held request is never delivered.
func (p *Proxy) Close() {
	p.ts.CloseClientConnections()
	p.ts.Close()
	p.client.CloseIdleConnections()
}

// Match sets which requests are faulted (nil: IsCommit).
func (p *Proxy) Match(m func(*http.Request) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if m == nil {
		m = IsCommit
	}
	p.match = m
}

// Script sets the faults of the next matched requests, one each; once they are used up,
// matched requests pass through (or go to Choose's function).
func (p *Proxy) Script(fs ...Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.script = append([]Fault(nil), fs...)
}

// Choose sets a function that picks the fault of every matched request the script does not
// cover (nil: forward).
func (p *Proxy) Choose(f func(*http.Request) Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.choose = f
}

// Count is how many matched requests got a fault of kind k.
func (p *Proxy) Count(k Kind) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.counts[k]
}

func (p *Proxy) pick(r *http.Request) (Fault, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.match(r) {
		return Fault{}, false
	}
	var f Fault
	switch {
	case len(p.script) > 0:
		f, p.script = p.script[0], p.script[1:]
	case p.choose != nil:
		f = p.choose(r)
	}
	if f.Kind == Hold && p.held != nil {
		f = Fault{Kind: DropBefore} // one held request at a time
	}
	p.counts[f.Kind]++
	return f, true
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		hangUp(w)
		return
	}
	req := &heldRequest{method: r.Method, uri: r.URL.RequestURI(), header: r.Header.Clone(), body: body}
	f, matched := p.pick(r)
	switch f.Kind {
	case RefuseBefore:
		refuse(w, f)
	case RefuseAfter:
		if resp, err := p.forward(req); err == nil {
			resp.Body.Close()
		}
		refuse(w, f)
	case DropBefore:
		hangUp(w)
	case DropAfter:
		if resp, err := p.forward(req); err == nil {
			resp.Body.Close()
		}
		hangUp(w)
	case CutBody:
		p.sendHalf(req)
		hangUp(w)
	case Hold:
		p.mu.Lock()
		p.held = req
		p.mu.Unlock()
		hangUp(w)
	case Delay:
		time.Sleep(f.Delay)
		p.relay(w, req, matched)
	default:
		p.relay(w, req, matched)
	}
}

// relay forwards req and answers with req's answer. After a matched request it delivers
// the held request, if any: a retry overtakes the attempt it repeats.
func (p *Proxy) relay(w http.ResponseWriter, req *heldRequest, matched bool) {
	resp, err := p.forward(req)
	if err != nil {
		hangUp(w)
		return
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	var held *heldRequest
	if matched {
		p.mu.Lock()
		held, p.held = p.held, nil
		p.mu.Unlock()
	}
	if held != nil {
		if hr, err := p.forward(held); err == nil {
			hr.Body.Close()
		}
	}
	if err != nil {
		hangUp(w)
		return
	}
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	w.Write(b)
}

func (p *Proxy) forward(req *heldRequest) (*http.Response, error) {
	out, err := http.NewRequest(req.method, p.target.Scheme+"://"+p.target.Host+req.uri, bytes.NewReader(req.body))
	if err != nil {
		return nil, err
	}
	out.Header = req.header.Clone()
	return p.client.Do(out)
}

// sendHalf writes req to the server with its full Content-Length and half its body, then
// closes the connection: the server sees a body cut midway.
func (p *Proxy) sendHalf(req *heldRequest) {
	c, err := net.Dial("tcp", p.target.Host)
	if err != nil {
		return
	}
	defer c.Close()
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", req.method, req.uri, p.target.Host)
	h := req.header.Clone()
	h.Del("Content-Length")
	h.Del("Transfer-Encoding")
	h.Write(&b)
	b.WriteString("Content-Length: " + strconv.Itoa(len(req.body)) + "\r\n\r\n")
	b.Write(req.body[:len(req.body)/2])
	c.Write(b.Bytes())
	// Wait for the server to give up on the body (it answers or closes), so the cut
	// request is settled before the client tries again.
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	io.Copy(io.Discard, c)
}

func refuse(w http.ResponseWriter, f Fault) {
	if f.Marked {
		w.Header().Set("x-ursula-not-applied", "Injected")
		w.Header().Set("x-ursula-not-applied-checked", "true")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(f.Status)
	fmt.Fprintf(w, `{"error":{"code":"INJECTED_%d","message":"refused by the fault proxy"}}`, f.Status)
}

// hangUp closes the client's connection without an answer.
func hangUp(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if c, _, err := hj.Hijack(); err == nil {
			c.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}
