# Ursula: replicated SQLite on durable streams. See README.md.
GO       ?= go
BIN      := bin
ADDR     ?= 127.0.0.1:4437
export GOFLAGS := -buildvcs=false

.PHONY: run build test unit vet fmt-check conformance conformance-deps bench fuzz clean

build:
	$(GO) build -o $(BIN)/ursula ./cmd/ursula

## run: start the server on $(ADDR) (memory engine)
run: build
	$(BIN)/ursula server --listen $(ADDR)

## test: vet, gofmt, unit tests with -race, then the conformance suite
test: fmt-check vet unit conformance

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './test/conformance/node_modules/*')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

unit:
	$(GO) test -race -count=1 ./...

conformance-deps:
	@test -d test/conformance/node_modules/@durable-streams/server-conformance-tests || (cd test/conformance && npm ci --no-audit --no-fund)

## conformance: start a fresh server on a free port and run the official suite against it
conformance: build conformance-deps
	test/conformance/run.sh

## bench: side-by-side load benchmark against the reference Node server
bench: build conformance-deps
	$(GO) build -o $(BIN)/ursula-bench ./cmd/ursula-bench
	test/bench/run.sh

## fuzz: run every fuzz target for FUZZTIME each
FUZZTIME ?= 20s
fuzz:
	@for pkg in ./streamcore ./server; do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test $$pkg -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) || exit 1; \
	  done; \
	done

clean:
	rm -rf $(BIN)
