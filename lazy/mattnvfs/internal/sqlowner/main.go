// Command sqlowner is a test helper of package mattnvfs: the owner of a replicated
// database in its own process (package vfs, on ncruces/go-sqlite3, cannot share a test
// binary with mattn/go-sqlite3: both register the driver name "sqlite3").
//
//	sqlowner STREAM_URL LOCAL_PATH
//
// It executes each line of stdin as one SQL statement (its own transaction) and answers
// "ok" or "error: ..." on stdout, one line each.
package main

import (
	"bufio"
	"fmt"
	"os"

	"github.com/ursula-go/ursula/vfs"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: sqlowner STREAM_URL LOCAL_PATH")
		os.Exit(2)
	}
	db, err := vfs.Open(os.Args[1], vfs.Options{Path: os.Args[2]})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer db.Close()
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if _, err := db.Exec(sc.Text()); err != nil {
			fmt.Printf("error: %v\n", err)
			continue
		}
		fmt.Println("ok")
	}
}
