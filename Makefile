# Ursula: replicated SQLite on durable streams. See README.md.
GO       ?= go
BIN      := bin
ADDR     ?= 127.0.0.1:4437
export GOFLAGS := -buildvcs=false

.PHONY: run build test unit vet fmt-check conformance conformance-cold conformance-deps s3-deps bench fuzz clean cluster extension bindings-deps bindings-test faultproxy soak

build:
	$(GO) build -o $(BIN)/ursula ./cmd/ursula

## run: start the server on $(ADDR) (memory engine)
run: build
	$(BIN)/ursula server --listen $(ADDR)

## test: vet, gofmt, unit tests with -race, then the conformance suite
test: fmt-check vet unit conformance bindings-test

## extension: the loadable SQLite extension bin/libursula_vfs.so (cgo, -buildmode=c-shared)
extension:
	$(GO) build -buildmode=c-shared -o $(BIN)/libursula_vfs.so ./cextension

## bindings-deps: better-sqlite3 for the Node binding, from the committed lock file (built with
## node-gyp against the installed Node headers: no prebuilt download)
NODE_DIR ?= $(shell dirname $$(dirname $$(command -v node)))
bindings-deps:
	@test -f bindings/node/node_modules/better-sqlite3/build/Release/better_sqlite3.node || \
	  (cd bindings/node && npm_config_nodedir=$(NODE_DIR) npm ci --no-audit --no-fund)

## faultproxy: the fault proxy as a command (bin/faultproxy), for the Python binding's mixed-fault run
faultproxy:
	$(GO) build -o $(BIN)/faultproxy ./test/faultproxy/cmd/faultproxy

## bindings-test: the Python and Node bindings on the extension, against a real server each test starts
bindings-test: build extension faultproxy bindings-deps
	cd bindings/python && URSULA_BIN=$(CURDIR)/$(BIN)/ursula URSULA_VFS_EXTENSION=$(CURDIR)/$(BIN)/libursula_vfs.so /usr/bin/python3 -m unittest discover -s tests -v
	cd bindings/node && URSULA_BIN=$(CURDIR)/$(BIN)/ursula URSULA_VFS_EXTENSION=$(CURDIR)/$(BIN)/libursula_vfs.so node --test test/

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './test/conformance/node_modules/*')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

## unit: every Go test with -race; the S3 cold-tier tests must run (versitygw from s3-deps)
unit: s3-deps
	URSULA_REQUIRE_S3=1 $(GO) test -race -count=1 ./...
	URSULA_REQUIRE_S3=1 $(GO) test -count=1 -run '^TestColdS3LargeStream$$' -v ./server/
	$(GO) test -count=1 -run '^TestPagesPast4GiB$$' ./lazy/
	URSULA_REQUIRE_S3=1 $(GO) test -count=1 -run '^(TestSnapshotRetentionLongRun|TestDatabaseOnColdTier)$$' ./vfs/

## s3-deps: install versitygw, the local S3 server of the cold-tier tests (once)
s3-deps:
	test/s3/install.sh

conformance-deps:
	@test -d test/conformance/node_modules/@durable-streams/server-conformance-tests || (cd test/conformance && npm ci --no-audit --no-fund)

## cluster: start a 3-node loopback cluster (raft engine) in the foreground; Ctrl-C stops it
cluster: build
	test/cluster/cluster.sh

## conformance: the official suite against memory, raft 1-node and raft 3-node servers, and
## through `ursula gateway` with auth on (to a raft node with auth on), a token on every request
conformance: build conformance-deps
	test/conformance/run.sh

## conformance-cold: the suite against servers whose cold tier (fs, then s3 on versitygw)
## flushes nearly everything at once, so reads span both tiers; memory engine, then raft
conformance-cold: build conformance-deps s3-deps
	COLD_BACKEND=fs test/s3/conformance-cold.sh
	COLD_BACKEND=s3 test/s3/conformance-cold.sh
	COLD_BACKEND=fs COLD_ENGINE=raft test/s3/conformance-cold.sh
	COLD_BACKEND=s3 COLD_ENGINE=raft test/s3/conformance-cold.sh

LAZY_MB ?= 1024
CATCHUP_MB ?= 64

## bench: load benchmark: ursula memory / raft (fsync never, always) / 3-node cluster / reference server
bench: build conformance-deps s3-deps
	$(GO) build -o $(BIN)/ursula-bench ./cmd/ursula-bench
	test/bench/run.sh
	@echo "== commit latency: replicated (vfs over loopback HTTP; server in this process, and ursula server with its defaults in another) vs plain local SQLite (WAL, synchronous NORMAL and FULL); ratios to FULL"
	$(GO) test -run '^$$' -bench '^BenchmarkCommit$$' -benchtime 2000x ./vfs 2>/dev/null | grep -E '^(Benchmark|ok|FAIL)' | awk -f test/bench/commit-ratio.awk
	@echo "== commit latency against a 3-node loopback cluster (node-list URL), leader first in the list vs last; ratios to leader-local"
	$(GO) test -run '^$$' -bench '^BenchmarkCommitCluster$$' -benchtime 2000x ./vfs 2>/dev/null | grep -E '^(Benchmark|ok|FAIL)' | awk -f test/bench/commit-ratio.awk
	@echo "== one producer's append round trip to a memory server in this process and in another, through the client's inline transport and net/http's side by side, with and without Producer-Digest (what a commit sends), 1/8/64 KiB bodies"
	$(GO) test -run '^$$' -bench '^BenchmarkAppendRoundTrip$$' -benchtime 2000x ./client 2>/dev/null | grep -E '^(Benchmark|ok|FAIL)'
	@echo "== cold start (fresh-host attach) of 10 MB and 100 MB databases"
	$(GO) test -run '^$$' -bench '^BenchmarkColdStart$$' -benchtime 3x ./vfs 2>/dev/null | grep -E '^(Benchmark|ok|FAIL)'
	@echo "== lazy read-only open vs full download, memory server and S3 (versitygw) cold tier: first point lookup, bytes fetched, 100 lookups, full scan, heap ($(LAZY_MB) MiB; LAZY_MB=128 for a quick run)"
	URSULA_REQUIRE_S3=1 URSULA_BENCH_LAZY_MB=$(LAZY_MB) $(GO) test -run '^$$' -bench '^BenchmarkLazyOpen$$' -benchtime 1x -timeout 60m ./vfs 2>/dev/null | grep -E '^(Benchmark|ok|FAIL)'
	@echo "== cold start from an S3 (versitygw) cold-tier snapshot, 10 MB / 100 MB / 1 GB, vs cp+fsync of the same file"
	URSULA_REQUIRE_S3=1 $(GO) test -run '^$$' -bench '^BenchmarkColdStartS3$$' -benchtime 1x -timeout 30m ./vfs 2>/dev/null | grep -E '^(Benchmark|ok|FAIL)|SKIP|coldstart_s3'
	@echo "== catch-up read throughput: hot tier vs cold tier (fs, s3 on versitygw), 64 MiB stream, 8 MiB responses"
	URSULA_REQUIRE_S3=1 $(GO) test -run '^$$' -bench 'CatchUp' -benchtime 5x ./server/
	@echo "== membership: a new node's catch-up of $(CATCHUP_MB) MiB (CATCHUP_MB=1024 for 1 GB), ratio to the ingest rate; appends/s during members add/remove, ratios to the steady state of the same run"
	URSULA_BENCH_MEMBERSHIP=1 URSULA_BENCH_CATCHUP_MB=$(CATCHUP_MB) $(GO) test -count=1 -run '^TestMembershipBench$$' -v -timeout 90m ./test/cluster | grep -E '^membership-bench|^(ok|FAIL|--- )'
	@echo "== commit latency: SQLite extension (Python) vs pure-Go adapter (vfs.Open), same server, vs plain local SQLite"
	$(MAKE) extension
	$(GO) run ./cextension/bench -n 2000 -ursula $(BIN)/ursula -extension $(BIN)/libursula_vfs.so

## soak: the long runs: the abuse cases at size (10k idle connections, 1,000 slow-loris headers,
## larger memory bursts with the release-off comparison, 5 rounds of kill -9 under producers) against real server processes, then
## the mixed-fault commit runs at length (SOAK_COMMITS commits each): pure-Go vfs.Open, then
## the extension through Python
SOAK_COMMITS ?= 3000
soak: build extension faultproxy
	ulimit -n $$(ulimit -Hn) 2>/dev/null; URSULA_SOAK=1 $(GO) test -count=1 -timeout 30m -v -run 'Soak|MemoryReturns|ConnectionCap|DeclaredOnly|NeverRead' ./test/abuse/
	URSULA_FAULT_COMMITS=$(SOAK_COMMITS) $(GO) test -race -count=1 -timeout 60m -run '^TestMixedFaultsNeverDiverge$$' -v ./vfs/ | grep -vE '^sqlite-ursula-vfs '
	cd bindings/python/tests && URSULA_FAULT_COMMITS=$(SOAK_COMMITS) URSULA_BIN=$(CURDIR)/$(BIN)/ursula URSULA_VFS_EXTENSION=$(CURDIR)/$(BIN)/libursula_vfs.so /usr/bin/python3 -m unittest -v test_sqlite_ursula.MixedFaultTest

## fuzz: run every fuzz target (every package with a func Fuzz in a test file) for FUZZTIME each
FUZZTIME ?= 20s
fuzz:
	@for pkg in $$(grep -rl '^func Fuzz' --include='*_test.go' . | xargs -n1 dirname | sort -u); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test $$pkg -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) || exit 1; \
	  done; \
	done

clean:
	rm -rf $(BIN)
