// Package gossip is cluster membership over hashicorp/memberlist (SWIM
// gossip and failure detection): who the live members are, what each
// gossips about itself (MemberMeta: its gRPC, HTTP and data-plane
// addresses, tier capacities, RDMA devices, role) and a coalesced signal
// on every change. It knows nothing of the node that uses it: the node
// builds placement from Members and reaches the peers at the addresses
// their metadata names; kvmesh route joins as a member with no capacity.
//
// A Membership keeps a snapshot of the members believed alive, sorted by
// id, with a version that grows whenever it changes, so that consumers
// rebuild what they derive only on change. Seeds that do not answer and
// up to ReconnectBatch members that failed are asked to join again every
// ReconnectInterval (memberlist alone never contacts a member it declared
// dead), so a node may start before its seeds and a partition heals by
// itself.
//
// Membership runs the anti-entropy exchange of the whole member list with a
// random member (memberlist's push-pull) itself, in place of memberlist's
// schedule: every AntiEntropyInterval, which is the profile's push-pull
// interval up to AntiEntropyMembers members and grows in proportion to the
// member count beyond, so that what a member sends for it each second does
// not grow with the cluster (an exchange carries every member's record).
// While exchanges bring members this node did not know, they come at the
// base interval.
//
// Besides MemberMeta a member gossips its backlog (SetBacklog: the queued
// work a peer could take), which changes often: Backlogs reads it, and a
// change of backlog alone is no membership change (the version stays).
//
// Gossip is encrypted (AES-GCM) when Options.SecretKey is set;
// a member with another key cannot join. Options.Transport
// replaces the UDP and TCP sockets, so that tests run partitions in one
// process on memberlist's MockNetwork.
//
// Concurrency: every method is safe for concurrent use. memberlist's
// callbacks run under its lock: they copy what they need and never call
// back into memberlist; a refresher goroutine rebuilds the snapshot, and
// Close stops it and the reconnector and waits for them.
package gossip
