#!/bin/sh
# Installs versitygw (an S3-compatible gateway over a local directory) once,
# for the cold-tier tests. Idempotent: does nothing if the binary exists.
set -eu
VERSION="${VERSITYGW_VERSION:-v1.8.0}"
BIN="$(go env GOPATH)/bin/versitygw"
if [ -x "$BIN" ]; then
	exit 0
fi
echo "installing versitygw $VERSION into $BIN (takes a few minutes the first time)" >&2
go install "github.com/versity/versitygw/cmd/versitygw@$VERSION"
test -x "$BIN"
