// Package gossiptest is a simulated network for package gossip: many
// members in one process, over memberlist's own protocol, on links with
// latency, loss and partitions. It is test support (tests and kvmesh bench
// link it; the node never does).
//
// A Network gives every node a memberlist.Transport (gossip.Options.
// Transport). Packets arrive after half their link's round trip, drawn per
// pair of nodes by Links (most links fast around a median, a few slow);
// they may be lost (Options.Loss), never cross a Partition and never reach
// a node SetDown. Streams take a round trip to dial and half of one per
// write. Every node's sent packets and bytes are counted (Counters), which
// is what gossip costs.
//
// memberlist runs on real time. Options.Dilation multiplies every
// latency and Dilate multiplies memberlist's timers by the same factor, so
// that a simulation of a thousand members on a busy machine keeps the
// protocol's ratios while the machine's own delays shrink against them;
// its measured times are divided by the factor.
//
// Concurrency: a Network and its Transports are safe for concurrent use;
// one scheduler goroutine delivers every packet, and Close stops it.
package gossiptest
