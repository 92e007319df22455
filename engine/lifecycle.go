package engine

import "context"

// Lifecycle is implemented by replicated engines for the admin plane's cluster operations:
// membership changes, the persistent drain mark and the recovery gate.
type Lifecycle interface {
	// Members is the JSON document of GET /__ursula/members: every group's servers.
	Members() any
	// ChangeMember applies one membership change in one group, on that group's leader
	// (forwarded there when this node does not lead it).
	ChangeMember(ctx context.Context, group uint64, c MemberChange) error
	// SetDrainMark sets or clears the node's persistent drain mark. While it is set the
	// node hands away every leadership it gains, also after a restart.
	SetDrainMark(on bool) error
	// RecoveryReport is the JSON document of GET /__ursula/recovery: the recovery gate of
	// every group and what a single voter may have lost after an unclean stop.
	RecoveryReport() any
	// AcceptUnsyncedLoss acknowledges a possible loss that no peer can repair (a single
	// voter after a host crash): the node stops reporting it.
	AcceptUnsyncedLoss() (any, error)
}

// MemberChange is one membership change of one group.
type MemberChange struct {
	Op       MemberOp
	NodeID   uint64
	URL      string // client URL of the node (learner only)
	RaftAddr string // cluster address of the node (learner only)
}

// MemberOp names a membership change.
type MemberOp byte

// The membership changes: add a non-voting learner, promote a learner to voter, remove a
// server.
const (
	AddLearner   MemberOp = 'L'
	PromoteVoter MemberOp = 'V'
	RemoveMember MemberOp = 'D'
)
