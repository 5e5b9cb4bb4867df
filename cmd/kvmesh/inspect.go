package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// inspectFlags are the flags every inspect subcommand shares.
type inspectFlags struct {
	addr    string
	output  string
	timeout time.Duration
	sec     securityFlags
}

// The defaults of inspect lookup's namespace flags: a small demo layout
// (8 KiB blocks), the one clients/python/example.py writes. With no
// namespace flag, lookup uses the node's prefill engine's namespace.
var defaultNamespace = prefixhash.Namespace{
	Model: "kvmesh/demo", DType: prefixhash.Float32, BlockTokens: 16,
	Layers: 2, KVHeads: 2, HeadDim: 16,
}

func inspectCmd() *cobra.Command {
	f := &inspectFlags{}
	c := &cobra.Command{
		Use:   "inspect",
		Short: "Look into a running node: stats, members, lookup, block",
		Long: `Look into a running node. Tables for people; -o json for scripts.

  kvmesh inspect stats                     per tier: blocks, bytes, capacity; hit ratio; cached tokens per namespace
  kvmesh inspect members                   the nodes of the cluster
  kvmesh inspect lookup --text "Hello"     how much of a prompt is cached, and where
  kvmesh inspect lookup --tokens 1,2,3
  kvmesh inspect block KEY                 one block (KEY: 32 hex digits, as lookup prints)
  kvmesh inspect quotas                    per namespace: usage and quota on the node
  kvmesh inspect partials                  incomplete blocks: which parts of each are present
  kvmesh inspect object NAME...            objects by name: size, pieces, tier, pin and TTL
  kvmesh inspect retain --object N --pin hard   pin objects or a prompt's prefix, lease them, or clear it
  kvmesh inspect queue --http-addr H:P     the token's tenant's queued batches (HTTP API)
  kvmesh inspect events --events tcp://H:P   tail KV events (vLLM's format) of a node or an engine

A node that serves TLS needs --tls-ca (or --tls, for a certificate the system
trusts) and, with mutual TLS, --tls-cert and --tls-key; one that asks for a
bearer token needs --auth-token-file.`,
	}
	pf := c.PersistentFlags()
	pf.StringVar(&f.addr, "addr", node.DefaultGRPCAddr, "gRPC address HOST:PORT of the node")
	pf.StringVarP(&f.output, "output", "o", "table", "table or json")
	pf.DurationVar(&f.timeout, "timeout", 5*time.Second, "how long to wait for the node")
	f.sec.register(pf)
	c.AddCommand(statsCmd(f), membersCmd(f), lookupCmd(f), blockCmd(f), quotasCmd(f), queueCmd(f), partialsCmd(f),
		objectCmd(f), retainCmd(f), eventsCmd(f))
	return c
}

// prepare applies the environment to the flags and checks -o.
func (f *inspectFlags) prepare(cmd *cobra.Command) error {
	if err := envLayer(cmd); err != nil {
		return err
	}
	if f.output != "table" && f.output != "json" {
		return fmt.Errorf("-o %q: want table or json", f.output)
	}
	return nil
}

// dial applies the environment to the flags and connects to the node.
func (f *inspectFlags) dial(cmd *cobra.Command) (*client.Client, context.Context, context.CancelFunc, error) {
	if err := f.prepare(cmd); err != nil {
		return nil, nil, nil, err
	}
	if err := checkHostPort("--addr", f.addr); err != nil {
		return nil, nil, nil, err
	}
	opts := client.Options{MaxRetries: -1}
	if err := f.sec.apply(&opts); err != nil {
		return nil, nil, nil, err
	}
	c, err := client.Dial(f.addr, opts)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--addr %q: %w", f.addr, err)
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
	return c, ctx, cancel, nil
}

// withNode dials the node and runs call, explaining its failure in one line.
func (f *inspectFlags) withNode(cmd *cobra.Command, call func(ctx context.Context, c *client.Client) error) error {
	c, ctx, cancel, err := f.dial(cmd)
	if err != nil {
		return err
	}
	defer c.Close()
	defer cancel()
	if err := call(ctx, c); err != nil {
		return f.explain(err)
	}
	return nil
}

// explain turns a failed call into one line saying what to do.
func (f *inspectFlags) explain(err error) error {
	st, ok := status.FromError(errors.Unwrap(err))
	if !ok || st.Code() == codes.OK { // not a status from the node
		return err
	}
	msg := st.Message()
	switch st.Code() {
	case codes.Unavailable:
		switch {
		case strings.Contains(msg, "first record does not look like a TLS handshake"):
			return fmt.Errorf("the node at %s does not speak TLS; drop the --tls flags", f.addr)
		case strings.Contains(msg, "x509:") || strings.Contains(msg, "handshake failed"):
			return fmt.Errorf("TLS with the node at %s failed (%s); check --tls-ca (the CA that signed its certificate) and --tls-server-name", f.addr, msg)
		case f.sec.enabled() && f.sec.cert == "" && containsAny(msg, "certificate required", "broken pipe", "connection reset", "EOF"):
			// TLS 1.3 ends the handshake before the server checks the
			// client's certificate: its refusal arrives as a closed
			// connection.
			return fmt.Errorf("the node at %s closed the TLS connection; if it asks for a client certificate (mutual TLS), pass --tls-cert/--tls-key", f.addr)
		case f.sec.enabled() && strings.Contains(msg, "tls:"):
			return fmt.Errorf("TLS with the node at %s failed (%s); check --tls-ca, --tls-server-name and, for mutual TLS, --tls-cert/--tls-key", f.addr, msg)
		}
		if m := wrongServer(f.addr, f.sec.enabled()); m != "" {
			return errors.New(m)
		}
		return fmt.Errorf("no kvmesh node answers at %s; start one with 'kvmesh serve' or pass --addr HOST:PORT", f.addr)
	case codes.Unauthenticated:
		if f.sec.tokenFile == "" {
			return fmt.Errorf("the node at %s asks for a bearer token: pass --auth-token-file FILE (or set KVMESH_AUTH_TOKEN_FILE)", f.addr)
		}
		return fmt.Errorf("the node at %s refused the token of %s: %s", f.addr, f.sec.tokenFile, msg)
	case codes.ResourceExhausted:
		return fmt.Errorf("the node at %s refused: %s", f.addr, msg)
	case codes.DeadlineExceeded:
		return fmt.Errorf("the node at %s did not answer within %v; check it is healthy or raise --timeout", f.addr, f.timeout)
	case codes.InvalidArgument:
		return fmt.Errorf("the node refused the request: %s", msg)
	case codes.NotFound:
		return errors.New(msg)
	case codes.Unimplemented:
		return fmt.Errorf("the server at %s is not a kvmesh node of this version: %s", f.addr, msg)
	}
	return fmt.Errorf("node at %s: %s: %s", f.addr, st.Code(), msg)
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

func (f *inspectFlags) print(w io.Writer, v any, table func(*tabwriter.Writer)) error {
	if f.output == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

type tierJSON struct {
	Name          string  `json:"name"`
	Blocks        uint64  `json:"blocks"`
	Bytes         uint64  `json:"bytes"`
	CapacityBytes uint64  `json:"capacity_bytes"`
	Used          float64 `json:"used"`
	// WrittenBytes are the bytes written to the tier (NVMe).
	WrittenBytes uint64 `json:"written_bytes"`
	// Evicted are the blocks that left the tier, by reason.
	Evicted client.TierEvictions `json:"evicted"`
}

type statsJSON struct {
	NodeID     string     `json:"node_id"`
	Tiers      []tierJSON `json:"tiers"`
	Hits       uint64     `json:"hits"`
	Misses     uint64     `json:"misses"`
	HitRatio   float64    `json:"hit_ratio"`
	Evictions  uint64     `json:"evictions"`
	Demotions  uint64     `json:"demotions"`
	Promotions uint64     `json:"promotions"`
	// SecondChances and ReusedBlocks are the reuse eviction policy's signal.
	SecondChances uint64 `json:"second_chances"`
	ReusedBlocks  uint64 `json:"reused_blocks"`
	// BranchingBlocks are the cached blocks with two or more cached
	// children (every policy).
	BranchingBlocks uint64 `json:"branching_blocks"`
	// Namespaces are the cached tokens per namespace (prefill.go).
	Namespaces []namespaceRow `json:"namespaces"`
}

func statsCmd(f *inspectFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "stats",
		Short: "Per tier: blocks, bytes, capacity; hits, misses and hit ratio",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var st client.Stats
			err := f.withNode(cmd, func(ctx context.Context, c *client.Client) (err error) {
				st, err = c.Stats(ctx)
				return err
			})
			if err != nil {
				return err
			}
			out := statsJSON{NodeID: st.NodeID, Hits: uint64(st.Hits), Misses: uint64(st.Misses),
				Evictions: uint64(st.Evictions), Demotions: uint64(st.Demotions), Promotions: uint64(st.Promotions),
				SecondChances: uint64(st.SecondChances), ReusedBlocks: uint64(st.ReusedBlocks), BranchingBlocks: uint64(st.BranchingBlocks)}
			if n := out.Hits + out.Misses; n > 0 {
				out.HitRatio = float64(out.Hits) / float64(n)
			}
			for _, t := range st.Tiers {
				tj := tierJSON{Name: t.Name, Blocks: uint64(t.Blocks), Bytes: uint64(t.Bytes), CapacityBytes: uint64(t.CapacityBytes), Evicted: t.Evicted,
					WrittenBytes: uint64(t.WrittenBytes)}
				if tj.CapacityBytes > 0 {
					tj.Used = float64(tj.Bytes) / float64(tj.CapacityBytes)
				}
				out.Tiers = append(out.Tiers, tj)
			}
			out.Namespaces = []namespaceRow{}
			for _, n := range st.Namespaces {
				out.Namespaces = append(out.Namespaces, namespaceRow{Digest: fmt.Sprintf("%016x", n.Digest), Model: n.Model,
					Blocks: uint64(n.Blocks), Tokens: uint64(n.Tokens), Bytes: uint64(n.Bytes)})
			}
			return f.print(cmd.OutOrStdout(), out, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "node %s\n\n", out.NodeID)
				fmt.Fprintln(w, "TIER\tBLOCKS\tBYTES\tCAPACITY\tUSED\tWRITTEN\tEVICTED: CAPACITY\tEXPIRED\tDEMOTED\tREFUSED\tUNADMITTED")
				for _, t := range out.Tiers {
					fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%.1f%%\t%s\t%d\t%d\t%d\t%d\t%d\n", t.Name, t.Blocks, formatSize(int64(t.Bytes)), formatSize(int64(t.CapacityBytes)), 100*t.Used,
						formatSize(int64(t.WrittenBytes)), t.Evicted.Capacity, t.Evicted.Expired, t.Evicted.Demoted, t.Evicted.Refused, t.Evicted.Unadmitted)
				}
				fmt.Fprintf(w, "\nhits %d  misses %d  hit ratio %.1f%%  evictions %d  demotions %d  promotions %d\n",
					out.Hits, out.Misses, 100*out.HitRatio, out.Evictions, out.Demotions, out.Promotions)
				if out.SecondChances > 0 || out.ReusedBlocks > 0 {
					fmt.Fprintf(w, "reuse policy: second chances %d  blocks marked reused %d\n", out.SecondChances, out.ReusedBlocks)
				}
				if out.BranchingBlocks > 0 {
					fmt.Fprintf(w, "blocks where cached chains fork (2+ children): %d\n", out.BranchingBlocks)
				}
				printNamespaces(w, out.Namespaces)
			})
		},
	}
}

type memberJSON struct {
	ID         string `json:"id"`
	Self       bool   `json:"self"`
	State      string `json:"state"`
	GRPCAddr   string `json:"grpc_addr"`
	HTTPAddr   string `json:"http_addr,omitempty"`
	DataAddr   string `json:"data_addr,omitempty"`
	GossipAddr string `json:"gossip_addr,omitempty"`
	ShmSocket  string `json:"shm_socket,omitempty"`
	// Shm says whether the node serves shared memory to clients on its
	// host (ShmSocket), and ShmHere whether that host is this one.
	Shm         bool       `json:"shm"`
	ShmHere     bool       `json:"shm_this_host"`
	HostID      string     `json:"host_id,omitempty"`
	RDMADevices []string   `json:"rdma_devices"`
	Fabric      string     `json:"fabric,omitempty"`
	Version     string     `json:"version,omitempty"`
	Tiers       []tierJSON `json:"tiers"`
}

func membersCmd(f *inspectFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "members",
		Short: "The nodes of the cluster, as the node at --addr sees them",
		Long: `The nodes of the cluster as the node at --addr sees them: each live node (alive,
or suspected of having failed) with its addresses, tiers, RDMA devices and
fabric (how it reads other nodes: tcp, or ucx with UCX's version and the
transports it opened). Tier usage is known for the node that answered
(marked *); for the others, their capacity. SHM says whether a node serves
shared memory to clients on its own host (its socket), and "here" when that
host is this one and this process can reach the socket: clients run here
read its blocks without a socket copy.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var resp client.Cluster
			err := f.withNode(cmd, func(ctx context.Context, c *client.Client) (err error) {
				resp, err = c.Members(ctx)
				return err
			})
			if err != nil {
				return err
			}
			out := []memberJSON{}
			for _, m := range resp.Members {
				mj := memberJSON{ID: m.ID, Self: m.ID == resp.SelfID, State: m.State, GRPCAddr: m.GRPCAddr,
					HTTPAddr: m.HTTPAddr, DataAddr: m.DataAddr, GossipAddr: m.GossipAddr, ShmSocket: m.ShmSocket,
					HostID: m.HostID, RDMADevices: append([]string{}, m.RDMADevices...), Fabric: m.Fabric, Version: m.Version, Tiers: []tierJSON{}}
				mj.Shm = m.ShmSocket != ""
				mj.ShmHere = mj.Shm && m.HostID != "" && m.HostID == client.HostID() && socketReachable(m.ShmSocket)
				for _, t := range m.Tiers {
					tj := tierJSON{Name: t.Name, Bytes: uint64(t.UsedBytes), CapacityBytes: uint64(t.CapacityBytes)}
					if tj.CapacityBytes > 0 {
						tj.Used = float64(tj.Bytes) / float64(tj.CapacityBytes)
					}
					mj.Tiers = append(mj.Tiers, tj)
				}
				out = append(out, mj)
			}
			return f.print(cmd.OutOrStdout(), out, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "ID\tSTATE\tGRPC\tDATA\tGOSSIP\tSHM\tTIERS\tRDMA\tFABRIC\tVERSION")
				for _, m := range out {
					var tiers []string
					for _, t := range m.Tiers {
						if m.Self {
							tiers = append(tiers, fmt.Sprintf("%s %s/%s", t.Name, formatSize(int64(t.Bytes)), formatSize(int64(t.CapacityBytes))))
						} else {
							tiers = append(tiers, fmt.Sprintf("%s %s", t.Name, formatSize(int64(t.CapacityBytes))))
						}
					}
					id, rdma := m.ID, "none"
					if m.Self {
						id += " *"
					}
					if len(m.RDMADevices) > 0 {
						rdma = strings.Join(m.RDMADevices, ",")
					}
					shm := "off"
					switch {
					case m.ShmHere:
						shm = "on, here: " + m.ShmSocket
					case m.Shm:
						shm = "on: " + m.ShmSocket
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", id, m.State, m.GRPCAddr, dash(m.DataAddr), dash(m.GossipAddr),
						shm, strings.Join(tiers, ", "), rdma, dash(m.Fabric), m.Version)
				}
				fmt.Fprintf(w, "\n%d members; * answered (tiers: used/capacity; others: capacity); SHM: shared memory for clients on the node's host (here: this host, socket reachable)\n", len(out))
			})
		},
	}
}

// socketReachable reports whether this process can connect to the unix
// socket at path.
func socketReachable(path string) bool {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// namespaceFlags select the namespace of a lookup.
type namespaceFlags struct {
	model, dtype, salt                    string
	layers, blockTokens, kvHeads, headDim int
	layout, scales, lora, scheme          string
	latentDim, extraKeyBytes              int
	hashSeed                              string
	groups                                string
}

func (n *namespaceFlags) register(c *cobra.Command) {
	d := defaultNamespace
	fs := c.Flags()
	fs.StringVar(&n.model, "model", d.Model, "namespace: model id")
	fs.StringVar(&n.dtype, "dtype", d.DType.String(), "namespace: KV dtype (float32, float16, bfloat16, fp8_e4m3, fp8_e5m2, int8)")
	fs.IntVar(&n.blockTokens, "block-tokens", d.BlockTokens, "namespace: tokens per block")
	fs.IntVar(&n.layers, "layers", d.Layers, "namespace: the model's number of layers (all of them; a pipeline stage's are a part of the block)")
	fs.IntVar(&n.kvHeads, "kv-heads", d.KVHeads, "namespace: the model's KV heads (all of them; a tensor-parallel rank's are a part of the block)")
	fs.IntVar(&n.headDim, "head-dim", d.HeadDim, "namespace: head dimension")
	fs.StringVar(&n.salt, "tenant-salt", "", "namespace: tenant salt")
	fs.StringVar(&n.layout, "kv-layout", "split", "namespace: KV layout, split (K and V per KV head) or latent (one latent vector per token and layer, MLA; give --latent-dim, and --kv-heads and --head-dim then default to 0)")
	fs.IntVar(&n.latentDim, "latent-dim", 0, "namespace: latent width per token and layer (latent layout; 576 for DeepSeek-V3/Kimi)")
	fs.StringVar(&n.scales, "scales", "none", "namespace: float32 scales after a quantised payload: none, block or head")
	fs.StringVar(&n.lora, "lora", "", "namespace: LoRA adapter id")
	fs.StringVar(&n.scheme, "key-scheme", "kvmesh", "namespace: key scheme, kvmesh or vllm (vLLM's block hashes, rooted in --hash-seed)")
	fs.StringVar(&n.hashSeed, "hash-seed", "", "namespace: vLLM's PYTHONHASHSEED (key scheme vllm)")
	fs.IntVar(&n.extraKeyBytes, "extra-key-bytes", 0, "namespace: header room each block reserves for extra keys (4 bytes plus each key's length; 0: none)")
	fs.StringVar(&n.groups, "groups", "", `namespace: a hybrid model's cache groups, JSON: [{"kind":"full","layers":[5],"kv_heads":8,"head_dim":128}, {"kind":"sliding","window":1024,"layers":[0,1,2,3,4],...}, {"kind":"state","layers":[6],"state_bytes":65536}]; --kv-heads and --head-dim then default to 0`)
}

func (n *namespaceFlags) namespace() (prefixhash.Namespace, error) {
	dt, err := prefixhash.ParseDType(n.dtype)
	if err != nil {
		return prefixhash.Namespace{}, fmt.Errorf("--dtype: %w", err)
	}
	layout, err := prefixhash.ParseKVLayout(n.layout)
	if err != nil {
		return prefixhash.Namespace{}, fmt.Errorf("--kv-layout: %w", err)
	}
	scales, err := prefixhash.ParseScales(n.scales)
	if err != nil {
		return prefixhash.Namespace{}, fmt.Errorf("--scales: %w", err)
	}
	scheme, err := prefixhash.ParseKeyScheme(n.scheme)
	if err != nil {
		return prefixhash.Namespace{}, fmt.Errorf("--key-scheme: %w", err)
	}
	heads, dim := n.kvHeads, n.headDim
	if (layout == prefixhash.LatentKV || n.groups != "") && heads == defaultNamespace.KVHeads && dim == defaultNamespace.HeadDim {
		heads, dim = 0, 0 // the demo's split shape, not given: a latent block has no heads, groups have their own
	}
	var groups prefixhash.Groups
	if n.groups != "" {
		if groups, err = prefixhash.ParseGroupsJSON([]byte(n.groups), dt); err != nil {
			return prefixhash.Namespace{}, fmt.Errorf("--groups: %w", err)
		}
	}
	ns := prefixhash.Namespace{Model: n.model, DType: dt, BlockTokens: n.blockTokens, Layers: n.layers,
		KVHeads: heads, HeadDim: dim, TenantSalt: n.salt,
		Layout: layout, LatentDim: n.latentDim, Scales: scales, LoRA: n.lora, Scheme: scheme, HashSeed: n.hashSeed,
		ExtraKeyBytes: n.extraKeyBytes, Groups: groups}
	if err := ns.Validate(); err != nil {
		return ns, fmt.Errorf("namespace flags: %w", err)
	}
	return ns, nil
}

// textTokens tokenizes text byte by byte: each UTF-8 byte is one token id
// (0..255). It is the tokenizer of the CLI and of the bundled engine's demo,
// so that a prompt typed here names the same blocks everywhere.
func textTokens(text string) []uint32 {
	t := make([]uint32, len(text))
	for i := 0; i < len(text); i++ {
		t[i] = uint32(text[i])
	}
	return t
}

// parseTokens parses a comma-separated list of token ids.
func parseTokens(s string) ([]uint32, error) {
	var out []uint32
	for i, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" && i > 0 {
			continue
		}
		v, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("--tokens: %q (item %d) is not a token id; write ids as 1,2,3", f, i+1)
		}
		out = append(out, uint32(v))
	}
	return out, nil
}

type lookupJSON struct {
	Namespace    string            `json:"namespace"`
	Digest       string            `json:"namespace_digest"`
	PromptTokens int               `json:"prompt_tokens"`
	PromptBlocks int               `json:"prompt_blocks"`
	CachedTokens int               `json:"cached_tokens"`
	CachedBlocks int               `json:"cached_blocks"`
	Blocks       []lookupBlockJSON `json:"blocks"`
	// Groups (a namespace with groups): what each group allows on its own;
	// the blocks listed are the chain's, and their node and tier those of
	// the first full group's records.
	Groups []lookupGroupJSON `json:"groups,omitempty"`
}

type lookupGroupJSON struct {
	Group  int    `json:"group"`
	Kind   string `json:"kind"`
	Blocks int    `json:"blocks"`
}

type lookupBlockJSON struct {
	Index int    `json:"index"`
	Key   string `json:"key"`
	Node  string `json:"node"`
	Tier  string `json:"tier"`
}

func lookupCmd(f *inspectFlags) *cobra.Command {
	var text, tokens string
	var nf namespaceFlags
	c := &cobra.Command{
		Use:   "lookup (--text T | --tokens 1,2,3)",
		Short: "How many leading tokens of a prompt are cached, and where",
		Long: `How many leading tokens of a prompt are cached, and where.

--text is tokenized byte by byte: each UTF-8 byte of T is one token id (0..255).
--tokens takes token ids. With no namespace flag, the namespace is that of the
node's prefill engine (what 'kvmesh prefill' caches). With any namespace flag,
it is the namespace the flags describe; those not given default to the demo
namespace that clients/python/example.py writes (--model kvmesh/demo alone
names it).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			toks, err := promptTokens(cmd, text, tokens)
			if err != nil {
				return err
			}
			given := namespaceGiven(cmd)
			if given { // refuse bad flags before dialing
				if _, err := nf.namespace(); err != nil {
					return err
				}
			}
			var ns prefixhash.Namespace
			var l client.Lookup
			err = f.withNode(cmd, func(ctx context.Context, c *client.Client) (err error) {
				if ns, err = lookupNamespace(ctx, c, given, &nf); err != nil {
					return err
				}
				l, err = c.Lookup(ctx, ns, client.Prompt{Tokens: toks})
				return err
			})
			if err != nil {
				return err
			}
			out := lookupJSON{Namespace: ns.String(), Digest: fmt.Sprintf("%016x", ns.Digest()), PromptTokens: l.PromptTokens, PromptBlocks: l.PromptBlocks,
				CachedTokens: l.CachedTokens, CachedBlocks: l.CachedBlocks, Blocks: []lookupBlockJSON{}}
			for i, b := range l.Blocks() {
				out.Blocks = append(out.Blocks, lookupBlockJSON{Index: i, Key: b.Key.String(), Node: b.NodeID, Tier: b.Tier})
			}
			for g, gl := range l.Groups {
				out.Groups = append(out.Groups, lookupGroupJSON{Group: g, Kind: gl.Kind.String(), Blocks: gl.Blocks})
			}
			return f.print(cmd.OutOrStdout(), out, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "namespace\t%s (digest %s)\n", out.Namespace, out.Digest)
				fmt.Fprintf(w, "prompt\t%d tokens, %d full blocks\n", out.PromptTokens, out.PromptBlocks)
				fmt.Fprintf(w, "cached\t%d tokens, %d blocks\n", out.CachedTokens, out.CachedBlocks)
				for _, g := range out.Groups {
					fmt.Fprintf(w, "group %d\t%s: %d blocks on its own\n", g.Group, g.Kind, g.Blocks)
				}
				if len(out.Blocks) > 0 {
					fmt.Fprintln(w, "\nBLOCK\tKEY\tNODE\tTIER")
					for _, b := range out.Blocks {
						fmt.Fprintf(w, "%d\t%s\t%s\t%s\n", b.Index, b.Key, b.Node, dash(b.Tier))
					}
					fmt.Fprintln(w, "\nTIER is known for the blocks the node at --addr holds itself (- for the others).")
				}
			})
		},
	}
	c.Flags().StringVar(&text, "text", "", "the prompt as text, one token per UTF-8 byte")
	c.Flags().StringVar(&tokens, "tokens", "", "the prompt as token ids: 1,2,3")
	nf.register(c)
	return c
}

type blockJSON struct {
	Key             string   `json:"key"`
	Parent          string   `json:"parent"`
	NamespaceDigest string   `json:"namespace_digest"`
	Node            string   `json:"node"`
	Tier            string   `json:"tier"`
	Tokens          []uint32 `json:"tokens"`
	PayloadBytes    uint64   `json:"payload_bytes"`
	EncodedBytes    uint64   `json:"encoded_bytes"`
	DType           string   `json:"dtype"`
	Layers          int      `json:"layers"`
	KVHeads         uint32   `json:"kv_heads"`
	HeadDim         uint32   `json:"head_dim"`
	KVLayout        string   `json:"kv_layout"`
	LatentDim       int      `json:"latent_dim,omitempty"`
	StateBytes      int      `json:"state_bytes,omitempty"`
	// A record of a namespace with groups: its group, kind, window and the
	// block's chain key (what lookup lists).
	Group        *int   `json:"group,omitempty"`
	GroupKind    string `json:"group_kind,omitempty"`
	WindowBlocks int    `json:"window_blocks,omitempty"`
	ChainKey     string `json:"chain_key,omitempty"`
}

func blockCmd(f *inspectFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "block KEY",
		Short: "Show one cached block (KEY: 32 hex digits, as lookup prints them)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := prefixhash.ParseKey(args[0])
			if err != nil {
				return fmt.Errorf("KEY %q: want the 32 hex digits that 'kvmesh inspect lookup' prints", args[0])
			}
			var b client.BlockInfo
			err = f.withNode(cmd, func(ctx context.Context, c *client.Client) (err error) {
				b, err = c.BlockInfo(ctx, key)
				return err
			})
			if err != nil {
				return err
			}
			out := blockJSON{Key: key.String(), Parent: b.Parent.String(), NamespaceDigest: fmt.Sprintf("%016x", b.NamespaceDigest),
				Node: b.NodeID, Tier: b.Tier, Tokens: b.Tokens, PayloadBytes: uint64(b.PayloadLen), EncodedBytes: uint64(b.EncodedLen),
				DType: b.DType.String(), Layers: b.Layers,
				KVHeads: uint32(b.KVHeads), HeadDim: uint32(b.HeadDim), KVLayout: b.KVLayout.String(), LatentDim: b.LatentDim, StateBytes: b.StateBytes}
			if b.Group >= 0 {
				g := b.Group
				out.Group, out.GroupKind, out.WindowBlocks, out.ChainKey = &g, b.GroupKind.String(), b.WindowBlocks, b.Chain.String()
			}
			return f.print(cmd.OutOrStdout(), out, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "key\t%s\nparent\t%s\nnamespace\t%s\nnode\t%s\ntier\t%s\n", out.Key, out.Parent, out.NamespaceDigest, out.Node, out.Tier)
				fmt.Fprintf(w, "tokens\t%d: %s\n", len(out.Tokens), tokenPreview(out.Tokens))
				fmt.Fprintf(w, "payload\t%s (%s encoded)\n", formatSize(int64(out.PayloadBytes)), formatSize(int64(out.EncodedBytes)))
				switch out.KVLayout {
				case "latent":
					fmt.Fprintf(w, "layout\t%s, %d layers, latent %d\n", out.DType, out.Layers, out.LatentDim)
				case "state":
					fmt.Fprintf(w, "layout\t%s, %d layers, state of %d heads x %d bytes\n", out.DType, out.Layers, out.KVHeads, out.StateBytes)
				default:
					fmt.Fprintf(w, "layout\t%s, %d layers, %d kv heads x %d\n", out.DType, out.Layers, out.KVHeads, out.HeadDim)
				}
				if out.Group != nil {
					fmt.Fprintf(w, "group\t%d (%s", *out.Group, out.GroupKind)
					if out.WindowBlocks > 0 {
						fmt.Fprintf(w, ", window %d blocks", out.WindowBlocks)
					}
					fmt.Fprintf(w, ") of block %s\n", out.ChainKey)
				}
			})
		},
	}
}

func tokenPreview(t []uint32) string {
	const n = 16
	parts := make([]string, 0, n+1)
	for i, v := range t {
		if i == n {
			parts = append(parts, "...")
			break
		}
		parts = append(parts, strconv.FormatUint(uint64(v), 10))
	}
	return strings.Join(parts, " ")
}

type quotaJSON struct {
	DRAMBytes uint64 `json:"dram_bytes"`
	NVMeBytes uint64 `json:"nvme_bytes"`
}

type namespaceQuotaJSON struct {
	Digest    string    `json:"digest"`
	Blocks    uint64    `json:"blocks"`
	DRAMBytes uint64    `json:"dram_bytes"`
	NVMeBytes uint64    `json:"nvme_bytes"`
	Quota     quotaJSON `json:"quota"`
	Own       bool      `json:"own"`
}

type quotasJSON struct {
	NodeID       string               `json:"node_id"`
	DefaultQuota quotaJSON            `json:"default_quota"`
	Namespaces   []namespaceQuotaJSON `json:"namespaces"`
}

func quotasCmd(f *inspectFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "quotas",
		Short: "Per namespace: blocks, bytes per tier, and the quota in force on the node",
		Long: `Per namespace (by digest; 'kvmesh inspect lookup' prints a namespace's): the
blocks and bytes it holds in each tier of the node at --addr, and its quota
there: its own (set with AdminService.SetQuota) or the node's default
(kvmesh serve --quota-dram, --quota-nvme). 0 is unlimited.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var resp client.Quotas
			err := f.withNode(cmd, func(ctx context.Context, c *client.Client) (err error) {
				resp, err = c.Quotas(ctx)
				return err
			})
			if err != nil {
				return err
			}
			q := func(p client.Quota) quotaJSON {
				return quotaJSON{DRAMBytes: uint64(p.DRAMBytes), NVMeBytes: uint64(p.NVMeBytes)}
			}
			out := quotasJSON{NodeID: resp.NodeID, DefaultQuota: q(resp.Default), Namespaces: []namespaceQuotaJSON{}}
			for _, n := range resp.Namespaces {
				out.Namespaces = append(out.Namespaces, namespaceQuotaJSON{Digest: fmt.Sprintf("%016x", n.Digest), Blocks: uint64(n.Blocks),
					DRAMBytes: uint64(n.DRAMBytes), NVMeBytes: uint64(n.NVMeBytes), Quota: q(n.Quota), Own: n.Own})
			}
			return f.print(cmd.OutOrStdout(), out, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "node %s   default quota: DRAM %s, NVMe %s\n\n", out.NodeID,
					quotaSize(out.DefaultQuota.DRAMBytes), quotaSize(out.DefaultQuota.NVMeBytes))
				fmt.Fprintln(w, "NAMESPACE\tBLOCKS\tDRAM USED/QUOTA\tNVME USED/QUOTA\tQUOTA")
				for _, n := range out.Namespaces {
					source := "default"
					if n.Own {
						source = "own"
					}
					fmt.Fprintf(w, "%s\t%d\t%s/%s\t%s/%s\t%s\n", n.Digest, n.Blocks,
						formatSize(int64(n.DRAMBytes)), quotaSize(n.Quota.DRAMBytes),
						formatSize(int64(n.NVMeBytes)), quotaSize(n.Quota.NVMeBytes), source)
				}
				fmt.Fprintf(w, "\n%d namespaces\n", len(out.Namespaces))
			})
		},
	}
}

func quotaSize(n uint64) string {
	if n == 0 {
		return "unlimited"
	}
	return formatSize(int64(n))
}
