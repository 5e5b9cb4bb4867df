//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/client"
)

// netLab is a private network of network namespaces: one per node, each with
// a veth into a bridge of a "switch" namespace (the cluster network,
// 10.213.0.0/24), and one into the root namespace (10.214.i.0/30) through
// which the test, in the root namespace, reaches the node's gRPC API. A
// partition moves nodes' switch ports to a second bridge: frames between
// the two sides are dropped without a word, as a real partition drops them.
type netLab struct {
	t      *testing.T
	prefix string
	sw     string
	nodes  []string // namespace of node i
}

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// newNetLab builds the lab for n nodes, or skips the test saying why it
// cannot. Everything it made is removed when the test ends, failed or not.
func newNetLab(t *testing.T, n int) *netLab {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("partition test skipped: the ip command (iproute2) is not installed")
	}
	l := &netLab{t: t, prefix: fmt.Sprintf("kvp%d", os.Getpid()%100000)}
	l.sw = l.prefix + "-sw"
	if err := ipCmd("netns", "add", l.sw); err != nil {
		t.Skipf("partition test skipped: network namespaces are not permitted here (run as root, or where ip netns is allowed): %v", err)
	}
	t.Cleanup(l.cleanup)
	if out, _ := exec.Command("ip", "-o", "addr").CombinedOutput(); bytes.Contains(out, []byte(" 10.214.")) {
		t.Skip("partition test skipped: this host already uses 10.214.0.0/16, which the test's links need")
	}
	must := func(args ...string) {
		t.Helper()
		if err := ipCmd(args...); err != nil {
			t.Skipf("partition test skipped: cannot build the test network: %v", err)
		}
	}
	must("-n", l.sw, "link", "add", "brA", "type", "bridge")
	must("-n", l.sw, "link", "add", "brB", "type", "bridge")
	must("-n", l.sw, "link", "set", "brA", "up")
	must("-n", l.sw, "link", "set", "brB", "up")
	for i := range n {
		ns := fmt.Sprintf("%s-n%d", l.prefix, i)
		must("netns", "add", ns)
		l.nodes = append(l.nodes, ns)
		c, s := fmt.Sprintf("%sc%d", l.prefix, i), fmt.Sprintf("%ss%d", l.prefix, i)
		must("link", "add", c, "type", "veth", "peer", "name", s)
		must("link", "set", c, "netns", ns)
		must("link", "set", s, "netns", l.sw)
		must("-n", l.sw, "link", "set", s, "master", "brA")
		must("-n", l.sw, "link", "set", s, "up")
		must("-n", ns, "addr", "add", fmt.Sprintf("%s/24", l.clusterIP(i)), "dev", c)
		must("-n", ns, "link", "set", c, "up")
		must("-n", ns, "link", "set", "lo", "up")
		h, g := fmt.Sprintf("%sh%d", l.prefix, i), fmt.Sprintf("%sg%d", l.prefix, i)
		must("link", "add", h, "type", "veth", "peer", "name", g)
		must("link", "set", g, "netns", ns)
		must("addr", "add", fmt.Sprintf("10.214.%d.1/30", i), "dev", h)
		must("link", "set", h, "up")
		must("-n", ns, "addr", "add", fmt.Sprintf("10.214.%d.2/30", i), "dev", g)
		must("-n", ns, "link", "set", g, "up")
	}
	return l
}

func (l *netLab) clusterIP(i int) string { return fmt.Sprintf("10.213.0.%d", i+1) }

// clientAddr is node i's gRPC address as the root namespace reaches it.
func (l *netLab) clientAddr(i int) string { return fmt.Sprintf("10.214.%d.2:7600", i) }

// partition puts the given nodes on the second bridge, cut off from the
// others; heal puts them back.
func (l *netLab) partition(nodes ...int) { l.move("brB", nodes) }
func (l *netLab) heal(nodes ...int)      { l.move("brA", nodes) }

func (l *netLab) move(bridge string, nodes []int) {
	l.t.Helper()
	for _, i := range nodes {
		if err := ipCmd("-n", l.sw, "link", "set", fmt.Sprintf("%ss%d", l.prefix, i), "master", bridge); err != nil {
			l.t.Fatal(err)
		}
	}
}

// cleanup deletes the namespaces (and with them every veth, root ends
// included). The nodes' processes are killed first by their own cleanups,
// registered later and so run earlier.
func (l *netLab) cleanup() {
	for _, ns := range append(l.nodes, l.sw) {
		if err := ipCmd("netns", "del", ns); err != nil {
			l.t.Logf("cleanup: %v", err)
		}
	}
	for i := range l.nodes {
		ipCmd("link", "del", fmt.Sprintf("%sh%d", l.prefix, i)) // gone with its peer already, normally
	}
}

// start runs kvmesh serve for node i inside its namespace.
func (l *netLab) start(i int, args ...string) *daemon {
	l.t.Helper()
	ip := l.clusterIP(i)
	cmd := exec.Command("ip", append([]string{"netns", "exec", l.nodes[i], binary(l.t), "serve", "--data-dir", l.t.TempDir(),
		"--grpc-addr", "0.0.0.0:7600", "--http-addr", "0.0.0.0:7601", "--data-addr", ip + ":7602", "--gossip-addr", ip + ":7603",
		"--shm-socket", "off", "--node-id", fmt.Sprintf("n%d", i)}, args...)...)
	return startCommand(l.t, cmd)
}

// TestClusterPartition splits a four-node cluster in two with a network
// partition in network namespaces: on either side, lookups and gets keep
// answering — misses for what the other side holds — within their
// deadlines, never errors; once the partition heals, the cluster is whole
// again and the other side's blocks are hits.
func TestClusterPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a network of namespaces and runs four kvmesh processes")
	}
	lab := newNetLab(t, 4)
	var ds []*daemon
	for i := range 4 {
		args := clusterFlags
		if i > 0 {
			args = append(args, "--join", lab.clusterIP(0)+":7603")
		}
		ds = append(ds, lab.start(i, args...))
	}
	clients := make([]*client.Client, 4)
	for i := range clients {
		c, err := client.Dial(lab.clientAddr(i), client.Options{Transport: client.TransportGRPC, MaxBatchBlocks: 256})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients[i] = c
	}
	for _, c := range clients {
		waitMembers(t, c, 4, ds...)
	}
	ctx := context.Background()
	const prompts, blocks = 6, 8
	tokens, payloads := make([][]uint32, prompts), make([][][]byte, prompts)
	for p := range prompts {
		tokens[p], payloads[p] = e2ePrompt(200+p, blocks)
		// Through n1: the producer keeps its blocks, so n0 and n2 hold
		// only what they own.
		if _, err := clients[1].Put(ctx, e2eNS, client.Prompt{Tokens: tokens[p]}, payloads[p]); err != nil {
			t.Fatalf("Put prompt %d: %v", p, err)
		}
	}
	for p := range prompts {
		waitFullHit(t, clients[0], tokens[p], blocks)
		waitFullHit(t, clients[2], tokens[p], blocks)
	}

	// Cut {n2, n3} off {n0, n1}; read through n0 and n2 meanwhile.
	lab.partition(2, 3)
	stream := newLookupStream([]*client.Client{clients[0], clients[2]}, tokens, payloads, 5*time.Second)
	end := time.Now().Add(60 * time.Second)
	stream.start(end)
	// Each side notices the other is gone, and keeps serving.
	waitMembers(t, clients[0], 2, ds...)
	waitMembers(t, clients[2], 2, ds...)
	before := stream.calls.Load()
	stream.waitFor(end, func() bool { return stream.calls.Load() >= before+40 })
	stream.finish(t, ds...)
	if stream.missedBy[0].Load() == 0 || stream.missedBy[1].Load() == 0 {
		t.Fatalf("misses during the partition: n0 %d, n2 %d; want both sides to miss the other's blocks",
			stream.missedBy[0].Load(), stream.missedBy[1].Load())
	}
	t.Logf("%d calls during the partition, slowest %v (deadline %v)", stream.calls.Load(), time.Duration(stream.slowest.Load()), stream.deadline)

	// Heal: the sides find each other again (members retry failed ones),
	// and what the other side owns is a hit once more.
	lab.heal(2, 3)
	for _, c := range clients {
		waitMembers(t, c, 4, ds...)
	}
	for p := range prompts {
		waitFullHit(t, clients[2], tokens[p], blocks)
		waitFullHit(t, clients[0], tokens[p], blocks)
	}
	for _, d := range ds {
		if _, err := d.stop(t); err != nil {
			t.Errorf("%s: exit %v\n%s", d.id, err, d.stderr)
		}
	}
}
