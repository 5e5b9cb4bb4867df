package client

import (
	"context"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// nodeInfo is what the client learns from the node's Members answer: how
// the cluster cuts prompts into placement chunks, and where the node's data
// plane is.
type nodeInfo struct {
	chunkTokens int
	dataAddr    string // TCP data plane; "" when the node serves none
	shmSocket   string // shared-memory socket; "" when off
	hostID      string // the node's host
}

// infoTTL is how long the client trusts what it learnt, so that a node that
// restarted on other ports is found again; infoRetry is how long it does
// without after the node did not answer (a node of another version, or one
// that is down).
const (
	infoTTL   = time.Minute
	infoRetry = 5 * time.Second
)

// nodeInfo returns what the client knows of its node, asking it (Members)
// when it knows nothing fresh. A node that does not answer yields an error;
// callers then do without (gRPC streams, no chunk keys).
func (c *Client) nodeInfo(ctx context.Context) (nodeInfo, error) {
	c.info.Lock()
	if c.info.node != nil && time.Since(c.info.fetched) < infoTTL {
		ni := *c.info.node
		c.info.Unlock()
		return ni, nil
	}
	if c.info.err != nil && time.Since(c.info.fetched) < infoRetry {
		err := c.info.err
		c.info.Unlock()
		return nodeInfo{}, err
	}
	c.info.Unlock()
	resp, err := c.membersPage(ctx, 1, "") // this node is first
	if err != nil {
		if ctx.Err() == nil {
			c.info.Lock()
			c.info.node, c.info.err, c.info.fetched = nil, err, time.Now()
			c.info.Unlock()
		}
		return nodeInfo{}, err
	}
	ni := nodeInfo{chunkTokens: int(resp.GetChunkTokens())}
	for _, m := range resp.GetMembers() {
		if m.GetId() == resp.GetSelfId() {
			ni.dataAddr, ni.shmSocket, ni.hostID = m.GetDataAddr(), m.GetShmSocket(), m.GetHostId()
			break
		}
	}
	c.info.Lock()
	c.info.node, c.info.err, c.info.fetched = &ni, nil, time.Now()
	c.info.Unlock()
	return ni, nil
}

// forgetNodeInfo makes the next nodeInfo ask the node again.
func (c *Client) forgetNodeInfo() {
	c.info.Lock()
	c.info.node, c.info.err = nil, nil
	c.info.Unlock()
}

// chunkKeys returns the chunk key of every block of chain (a prompt's keys
// from block 0), or nil when the node cannot say how the cluster chunks
// prompts (it then finds blocks without them, at one more round trip).
func (c *Client) chunkKeys(ctx context.Context, ns prefixhash.Namespace, chain []prefixhash.Key) []prefixhash.Key {
	ni, err := c.nodeInfo(ctx)
	if err != nil || ni.chunkTokens <= 0 {
		return nil
	}
	cb := prefixhash.ChunkBlocks(ns.BlockTokens, ni.chunkTokens)
	out := make([]prefixhash.Key, len(chain))
	for i := range chain {
		out[i] = prefixhash.ChunkKey(chain, i, cb)
	}
	return out
}

// localHostID identifies this host's running kernel, as the node reports
// its own: equal ids mean the node's shared memory can be mapped here. It
// is read once per process (every data-plane call asks; reading the file
// each time was a third of a 64 KiB shared-memory GET).
var localHostID = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
})

// HostID returns this host's id as nodes report theirs (Member.HostID): a
// node with the same id runs on this host, and its shared memory can be
// mapped here.
func HostID() string { return localHostID() }
