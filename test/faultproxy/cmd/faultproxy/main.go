// Command faultproxy runs the fault proxy of package faultproxy in front of a stream
// server, for tests written in other languages (the Python binding's mixed-fault run):
//
//	faultproxy -target http://127.0.0.1:4437 [-seed N]
//
// It prints "url <proxy base URL>" and "seed <n>", then reads commands, one a line, from
// its standard input and answers each with "ok" (or "error <why>"):
//
//	mixed   fault commits at random (faultproxy.Mixed, seeded by -seed)
//	off     pass every request through
//	counts  print "counts <kind>=<n> ..." first
//
// It stops at the end of its input.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"strings"
	"time"

	"github.com/ursula-go/ursula/test/faultproxy"
)

func main() {
	target := flag.String("target", "", "base URL of the stream server (http://host:port)")
	seed := flag.Int64("seed", 0, "seed of the mixed faults (0: the time)")
	flag.Parse()
	if *target == "" {
		fmt.Fprintln(os.Stderr, "faultproxy: -target is required")
		os.Exit(2)
	}
	if *seed == 0 {
		*seed = time.Now().UnixNano()
	}
	p, err := faultproxy.New(*target)
	if err != nil {
		fmt.Fprintln(os.Stderr, "faultproxy:", err)
		os.Exit(1)
	}
	defer p.Close()
	mixed := faultproxy.Mixed(rand.New(rand.NewSource(*seed)), []int{401, 402, 403, 409, 429, 500, 502, 503})
	fmt.Printf("url %s\nseed %d\n", p.URL, *seed)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch cmd := strings.TrimSpace(in.Text()); cmd {
		case "mixed":
			p.Choose(mixed)
		case "off":
			p.Choose(nil)
		case "counts":
			fmt.Printf("counts %s\n", p.Counts())
		case "":
			continue
		default:
			fmt.Printf("error unknown command %q\n", cmd)
			continue
		}
		fmt.Println("ok")
	}
}
