//go:build !linux

package inlinehttp

import "net"

// connAlive cannot peek without a reader goroutine here: an idle connection is taken as
// alive, and a request that finds it closed is sent again where that is safe.
func connAlive(net.Conn) bool { return true }
