package gossip

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// MemberMeta is what a node gossips about itself: where to reach it and what
// it offers. It travels as memberlist node metadata (JSON, at most
// memberlist.MetaMaxSize bytes).
type MemberMeta struct {
	GRPCAddr  string   `json:"grpc"`
	HTTPAddr  string   `json:"http,omitempty"`
	DataAddr  string   `json:"data,omitempty"`
	DRAMBytes int64    `json:"dram"`
	NVMeBytes int64    `json:"nvme"`
	RDMA      []string `json:"rdma,omitempty"` // RDMA devices found on the host
	Version   string   `json:"ver,omitempty"`
	// Role is what the member's HTTP API does for a router (kvmesh route):
	// RoleBoth, RolePrefill or RoleDecode for a node with an engine (""
	// from an older node reads as RoleBoth), RoleStore for one without,
	// RoleRouter for a router, which offers no capacity and owns nothing.
	Role string `json:"role,omitempty"`
	// TLS says the member serves every listener over TLS (its HTTP address
	// included): a router without the cluster's CA must not send it
	// clients' bearer tokens in the clear.
	TLS bool `json:"tls,omitempty"`
	// Fabric is how the member reads other nodes: "tcp", or "ucx", its
	// UCX version and the transports UCX opened (issue 36).
	Fabric string `json:"fabric,omitempty"`
}

// Roles of members (MemberMeta.Role, PrefillOptions.Role).
const (
	RoleBoth    = "both"    // prefill and decode
	RolePrefill = "prefill" // computes prompts for a router; decodes only what it is sent directly
	RoleDecode  = "decode"  // decodes after a prefill node computed the prompt
	RoleStore   = "store"   // no engine (Prefill.Disabled)
	RoleRouter  = "router"  // kvmesh route
)

// MemberInfo is one member as the local node sees it.
type MemberInfo struct {
	ID         string
	GossipAddr string
	// State is "alive": the snapshot holds the members memberlist believes
	// live (it may suspect one; it does not report suspicion), and a member
	// that failed or left is dropped from it.
	State string
	Meta  MemberMeta
}

// Weight is the member's placement weight: the bytes it offers to the cache.
func (m MemberInfo) Weight() float64 { return float64(m.Meta.DRAMBytes + m.Meta.NVMeBytes) }

// Options configure Start.
type Options struct {
	// NodeID names this node in the cluster; it must be unique and stable
	// across restarts (placement hashes it). Default: hostname:gossip-port.
	NodeID string
	// GossipAddr is the host:port memberlist binds (UDP and TCP). Port 0
	// picks a free port. Default 127.0.0.1:7603.
	GossipAddr string
	// AdvertiseAddr is the IP other members reach this one at. Default: the
	// GossipAddr host, or, when that is unspecified (0.0.0.0), a private
	// IP of the host (memberlist's choice).
	AdvertiseAddr string
	// Join lists seeds (host:port of other members' gossip addresses).
	// Empty: start a new cluster.
	Join []string
	// RetryJoin starts the node alone when no seed answers, instead of
	// failing with ErrJoin, and keeps trying the seeds in the background.
	RetryJoin bool
	// ReconnectInterval is how often the seeds not in the cluster, and the
	// members that failed in the last ReconnectFor, are asked to join again
	// (so that a partition heals, and a node that started before its seeds
	// finds them). Default 10s, 1s with Fast.
	ReconnectInterval time.Duration
	// ReconnectFor is how long a failed member is tried again. Default 1h.
	// Each ReconnectInterval the seeds not in the cluster are tried, and
	// at most ReconnectBatch of the failed members, chosen at random: one
	// answer heals a partition, and a node that asked every member that
	// failed would exchange the whole member list with each of them (a
	// partition of 10% of 1,024 nodes would cost each node of the smaller
	// side some 900 exchanges of 1,024 members' records).
	ReconnectFor time.Duration
	// SecretKey, when set, encrypts gossip with AES-GCM; it must be 16, 24
	// or 32 bytes. Nodes with a different key cannot join.
	SecretKey []byte
	// Meta is gossiped to the other members.
	Meta MemberMeta
	// Fast selects loopback timings (probe every 500ms, 200ms probe
	// timeout, a failure confirmed within about 2s) instead of memberlist's
	// LAN timings. For tests and single-host clusters.
	Fast bool
	// Logger receives memberlist's log lines. Default slog.Default().
	Logger *slog.Logger
	// Transport, when set, carries gossip instead of UDP and TCP sockets
	// bound on GossipAddr, and gives the address members advertise: tests
	// pass memberlist.MockNetwork transports, or one that drops traffic,
	// to run partitions in one process without network namespaces.
	// Default nil: memberlist's network transport on GossipAddr.
	Transport memberlist.Transport
	// Tune, when set, adjusts memberlist's configuration once the profile
	// (Fast or LAN) has set it and before memberlist starts: a simulation
	// slows every interval by one factor (gossiptest.Dilate), an
	// experiment tries other timings. Default nil.
	//
	// The configuration's PushPullInterval is the anti-entropy exchange's
	// base interval (AntiEntropyInterval), which Membership runs in place
	// of memberlist's periodic push-pull; 0 turns it off.
	Tune func(*memberlist.Config)
}

// ReconnectBatch is how many of the members that failed a node asks to join
// again each ReconnectInterval (Options.ReconnectFor).
const ReconnectBatch = 3

// AntiEntropyMembers is the member count up to which the anti-entropy
// exchange runs at its base interval (AntiEntropyInterval).
const AntiEntropyMembers = 32

// AntiEntropyInterval is how long a member of a cluster of n members waits
// between two exchanges of its whole member list with a random member (a
// memberlist push-pull), with base the profile's interval (30s lan, 5s
// fast): base up to AntiEntropyMembers members, then base × n /
// AntiEntropyMembers. An exchange carries every member's record, so its
// bytes grow with n; spacing the exchanges by n keeps what a member sends
// for them each second the same at 1,024 members as at 32. (memberlist's
// own schedule stretches the interval only by log2 n, so a member's
// push-pull bytes grew about n / log2 n.) The cost is repair time: a
// member that missed a broadcast (lost packets) learns what it missed at
// its next exchange or the next one another member starts with it, about
// half an interval later; failures and joins themselves still spread by
// gossip in O(log n) rounds, and a partition heals through the reconnector.
func AntiEntropyInterval(base time.Duration, n int) time.Duration {
	if n <= AntiEntropyMembers {
		return base
	}
	return time.Duration(float64(base) * float64(n) / AntiEntropyMembers)
}

// Errors of membership.
var (
	ErrJoin      = errors.New("gossip: could not join the cluster")
	ErrSecretKey = errors.New("gossip: gossip key must be 16, 24 or 32 bytes")
)

// Membership tracks the live members of the cluster with memberlist (SWIM
// gossip and failure detection). It keeps a snapshot of the members and a
// version that changes whenever the snapshot does, so consumers (placement)
// rebuild only on change.
type Membership struct {
	ml  *memberlist.Memberlist
	log *slog.Logger

	// local is what this node gossips about itself; SetBacklog changes it.
	local struct {
		sync.Mutex
		meta    gossipMeta
		encoded []byte
	}

	name      string // this node's id
	addr      string // the address memberlist listens on
	seeds     []string
	joined    atomic.Bool   // no seeds, or one of them answered a Join
	reconnect time.Duration // interval
	retryFor  time.Duration

	joins     atomic.Uint64 // members that joined (NotifyJoin), ever
	kick      chan struct{} // memberlist events, coalesced; drained by the refresher
	stop      chan struct{}
	done      chan struct{} // the refresher and the reconnector exited
	closeOnce sync.Once
	closeErr  error

	// life orders Leave and Close: memberlist panics on a leave after
	// its shutdown.
	life struct {
		sync.Mutex
		closed bool
	}

	mu struct {
		sync.Mutex
		version uint64
		members []MemberInfo
		subs    []chan struct{}
		live    map[string]MemberInfo   // by id, as the event callbacks copied them
		failed  map[string]failedMember // by id: members that died (not left)
		backlog map[string]int          // by id: live members' advertised backlogs, when not 0
	}
}

// gossipMeta is a member's metadata on the wire: MemberMeta, whose changes
// are membership changes (placement rebuilds), and the backlog, which
// changes often and is not one (Membership.Backlogs). A backlog of 0 is
// left out, so that a node with none sends what nodes before it sent.
type gossipMeta struct {
	MemberMeta
	Backlog int `json:"backlog,omitempty"`
}

// failedMember is a member that failed, to be asked to join again.
type failedMember struct {
	addr  string
	since time.Time
}

// Start binds the gossip address, joins the seeds (if any) and
// returns once this node is a member. The caller must Close it.
func Start(opts Options) (*Membership, error) {
	meta, err := opts.check()
	if err != nil {
		return nil, err
	}
	m := &Membership{log: opts.Logger, kick: make(chan struct{}, 1),
		seeds: opts.Join, reconnect: opts.ReconnectInterval, retryFor: opts.ReconnectFor,
		stop: make(chan struct{}), done: make(chan struct{})}
	m.mu.failed = make(map[string]failedMember)
	m.mu.live = make(map[string]MemberInfo)
	m.mu.backlog = make(map[string]int)
	m.local.meta, m.local.encoded = gossipMeta{MemberMeta: opts.Meta}, meta
	conf := m.config(opts)
	m.name = conf.Name
	if opts.Tune != nil {
		opts.Tune(conf)
	}
	// Membership runs the periodic push-pull itself (antiEntropy), at an
	// interval that grows with the member count.
	antiEntropy := conf.PushPullInterval
	conf.PushPullInterval = 0
	anyPort := conf.BindPort == 0 // memberlist writes the port it picks into conf
	ml, err := memberlist.Create(conf)
	if err != nil {
		return nil, fmt.Errorf("gossip: start gossip on %s: %w", opts.GossipAddr, err)
	}
	m.ml = ml
	// memberlist's LocalNode is its own record, rewritten under its lock
	// by every UpdateNode (SetBacklog): read it once, here.
	m.addr = ml.LocalNode().Address()
	if opts.NodeID == "" && anyPort {
		// The name must be known before Create; with a random port it carries "0".
		// Nodes started this way are for tests, where the id is given.
		m.log.Warn("gossip port 0 without a node id: the node id carries port 0", "id", conf.Name)
	}
	if err := m.join(opts); err != nil {
		_ = ml.Shutdown()
		return nil, err
	}
	m.refresh()
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		m.refresher()
	}()
	go func() {
		defer wg.Done()
		m.reconnector()
	}()
	go func() {
		defer wg.Done()
		m.antiEntropy(antiEntropy)
	}()
	go func() {
		wg.Wait()
		close(m.done)
	}()
	return m, nil
}

// check fills opts' defaults, refuses what cannot work and returns the
// encoded metadata.
func (opts *Options) check() (meta []byte, _ error) {
	if len(opts.SecretKey) != 0 && !slices.Contains([]int{16, 24, 32}, len(opts.SecretKey)) {
		return nil, fmt.Errorf("%w (got %d)", ErrSecretKey, len(opts.SecretKey))
	}
	if opts.GossipAddr == "" {
		opts.GossipAddr = "127.0.0.1:7603"
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	_, portStr, err := net.SplitHostPort(opts.GossipAddr)
	if err != nil {
		return nil, fmt.Errorf("gossip: gossip addr %q: %w", opts.GossipAddr, err)
	}
	if port, err := strconv.Atoi(portStr); err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("gossip: gossip addr %q: bad port", opts.GossipAddr)
	}
	meta, err = json.Marshal(gossipMeta{MemberMeta: opts.Meta})
	if err != nil {
		return nil, fmt.Errorf("gossip: encode member meta: %w", err)
	}
	if len(meta) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("gossip: member meta is %d bytes, memberlist allows %d", len(meta), memberlist.MetaMaxSize)
	}
	if opts.ReconnectInterval <= 0 {
		opts.ReconnectInterval = 10 * time.Second
		if opts.Fast {
			opts.ReconnectInterval = time.Second
		}
	}
	if opts.ReconnectFor <= 0 {
		opts.ReconnectFor = time.Hour
	}
	return meta, nil
}

// config is memberlist's configuration for m, of opts (checked).
func (m *Membership) config(opts Options) *memberlist.Config {
	host, portStr, _ := net.SplitHostPort(opts.GossipAddr)
	port, _ := strconv.Atoi(portStr)
	conf := memberlist.DefaultLANConfig()
	// A node that restarts on another port (port 0) keeps its id: let it
	// take its name back once the old incarnation is known dead.
	conf.DeadNodeReclaimTime = 30 * time.Second
	if opts.Fast {
		conf = memberlist.DefaultLocalConfig()
		conf.ProbeInterval = 500 * time.Millisecond
		conf.SuspicionMaxTimeoutMult = 2
		conf.PushPullInterval = 5 * time.Second
		conf.DeadNodeReclaimTime = time.Second
	}
	// Port 0: memberlist needs one port free for both TCP and UDP; let it
	// pick.
	conf.BindAddr, conf.BindPort = host, port
	conf.AdvertiseAddr, conf.AdvertisePort = opts.AdvertiseAddr, 0
	if opts.AdvertiseAddr != "" {
		conf.AdvertisePort = port // memberlist replaces a 0 with the port it picked
	}
	conf.Transport = opts.Transport
	conf.Delegate = (*delegate)(m)
	conf.Events = (*events)(m)
	conf.Conflict = (*events)(m)
	conf.Logger = log.New(&logWriter{log: opts.Logger}, "", 0)
	conf.SecretKey = opts.SecretKey
	if len(opts.SecretKey) == 0 {
		conf.GossipVerifyIncoming, conf.GossipVerifyOutgoing = false, false
	}
	conf.Name = opts.NodeID
	if conf.Name == "" {
		h, _ := os.Hostname()
		conf.Name = h + ":" + portStr
	}
	return conf
}

// join joins the seeds, if any: ErrJoin when none answers, unless
// opts.RetryJoin, which leaves it to the reconnector.
func (m *Membership) join(opts Options) error {
	m.joined.Store(len(opts.Join) == 0)
	if len(opts.Join) == 0 {
		return nil
	}
	contacted, err := m.ml.Join(opts.Join)
	m.joined.Store(contacted > 0)
	if err != nil && contacted == 0 {
		if !opts.RetryJoin {
			return fmt.Errorf("%w via %v: %w", ErrJoin, opts.Join, err)
		}
		m.log.Warn("no seed answered; serving alone and trying them again in the background",
			"seeds", opts.Join, "retry_every", m.reconnect, "err", err)
	}
	return nil
}

// Joined reports whether the node has joined its cluster: it was started
// with no seeds, one of them answered a join (the first, or a retry), or
// another member joined it.
func (m *Membership) Joined() bool {
	if m.joined.Load() {
		return true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.mu.members) > 1
}

// reconnector asks, every ReconnectInterval, the seeds that are not members
// and the members that failed recently to join again, so that a partition
// heals and a node started before its seeds finds them. memberlist alone
// never contacts a member it declared dead again.
func (m *Membership) reconnector() {
	t := time.NewTicker(m.reconnect)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		targets := m.reconnectTargets(time.Now())
		if len(targets) == 0 {
			continue
		}
		if n := m.rejoin(targets); n == 0 {
			m.log.Debug("rejoin attempt failed", "targets", targets)
		} else {
			m.joined.Store(true)
			m.log.Info("rejoined members", "targets", targets, "contacted", n)
		}
	}
}

// rejoin asks each of targets to join, all at once (a dial to an address
// still cut off takes memberlist's TCP timeout; one after the other, they
// would delay the answer of one that is back), and returns how many
// answered.
func (m *Membership) rejoin(targets []string) int {
	var answered atomic.Int64
	var wg sync.WaitGroup
	for _, a := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if n, _ := m.ml.Join([]string{a}); n > 0 {
				answered.Add(1)
			}
		}()
	}
	wg.Wait()
	return int(answered.Load())
}

// antiEntropy exchanges the whole member list with a random live member
// (memberlist's push-pull, through Join) every AntiEntropyInterval of the
// member count (±50%, at random), the first time after a random part of
// base so that members started together do not exchange together. While exchanges bring news
// (members this node did not know, as after it joined through a seed that
// knew only part of the cluster), the next one comes after base. base 0:
// never.
func (m *Membership) antiEntropy(base time.Duration) {
	if base <= 0 {
		return
	}
	t := time.NewTimer(rand.N(base))
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		n, news := m.exchange()
		wait := AntiEntropyInterval(base, n)
		if news {
			wait = base
		}
		// ±50%: members that joined together, and exchanged at the base
		// interval together while the cluster grew, drift apart instead
		// of exchanging in one burst every interval.
		t.Reset(wait/2 + rand.N(wait))
	}
}

// exchange runs one push-pull with a random live member, and returns the
// member count after it and whether a member joined meanwhile.
func (m *Membership) exchange() (members int, news bool) {
	m.mu.Lock()
	addrs := make([]string, 0, len(m.mu.live))
	for id, mi := range m.mu.live {
		if id != m.name {
			addrs = append(addrs, mi.GossipAddr)
		}
	}
	m.mu.Unlock()
	if len(addrs) == 0 {
		return 1, false
	}
	before := m.joins.Load()
	// Close shuts memberlist down only once this goroutine has returned.
	if _, err := m.ml.Join([]string{addrs[rand.N(len(addrs))]}); err != nil {
		m.log.Debug("anti-entropy exchange failed", "err", err)
	}
	m.mu.Lock()
	members = len(m.mu.live)
	m.mu.Unlock()
	return members, m.joins.Load() != before
}

// reconnectTargets returns the seeds that are not the address of a live
// member, and the addresses of at most ReconnectBatch members, chosen at
// random, of those that failed within ReconnectFor.
func (m *Membership) reconnectTargets(now time.Time) []string {
	self := m.GossipAddr()
	m.mu.Lock()
	defer m.mu.Unlock()
	// skip holds the live members' addresses and those already chosen.
	skip := make(map[string]bool, len(m.mu.members))
	for _, mi := range m.mu.members {
		skip[mi.GossipAddr] = true
	}
	var out, failed []string
	for _, s := range m.seeds {
		if !skip[s] && s != self {
			out = append(out, s)
			skip[s] = true
		}
	}
	for id, f := range m.mu.failed {
		switch {
		case now.Sub(f.since) > m.retryFor:
			delete(m.mu.failed, id)
		case !skip[f.addr]:
			failed = append(failed, f.addr)
			skip[f.addr] = true
		}
	}
	for k := 0; k < ReconnectBatch && len(failed) > 0; k++ {
		i := rand.N(len(failed))
		out = append(out, failed[i])
		failed[i] = failed[len(failed)-1]
		failed = failed[:len(failed)-1]
	}
	return out
}

// refresher rebuilds the snapshot after memberlist events. It runs outside
// memberlist's callbacks, which hold memberlist's node lock that Members()
// takes.
func (m *Membership) refresher() {
	for {
		select {
		case <-m.kick:
			m.refresh()
		case <-m.stop:
			return
		}
	}
}

// SetBacklog advertises how much queued work this node holds that a peer
// could take (openai's work stealing: batches nobody runs). It is gossiped
// with the node's metadata, but is no membership change: the snapshot's
// version stays, placement does not rebuild. Each change is one gossip
// broadcast, so a caller sends coarse values, not every count.
func (m *Membership) SetBacklog(n int) error {
	m.local.Lock()
	if m.local.meta.Backlog == n {
		m.local.Unlock()
		return nil
	}
	gm := m.local.meta
	gm.Backlog = n
	enc, err := json.Marshal(gm)
	if err == nil && len(enc) > memberlist.MetaMaxSize {
		err = fmt.Errorf("member meta is %d bytes, memberlist allows %d", len(enc), memberlist.MetaMaxSize)
	}
	if err != nil {
		m.local.Unlock()
		return fmt.Errorf("gossip: advertise backlog: %w", err)
	}
	m.local.meta, m.local.encoded = gm, enc
	m.local.Unlock()
	m.life.Lock()
	defer m.life.Unlock()
	if m.life.closed {
		return nil
	}
	// UpdateNode queues the broadcast and waits for gossip to send it; its
	// only error is that wait's timeout, when the broadcast stays queued.
	_ = m.ml.UpdateNode(time.Second)
	return nil
}

// Backlogs returns the backlogs the live members advertise (SetBacklog),
// by id, those of 0 left out; this node's own is in it too once gossip
// brought it back.
func (m *Membership) Backlogs() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.mu.backlog)
}

// LocalID returns this node's id.
func (m *Membership) LocalID() string { return m.name }

// GossipAddr returns the address memberlist actually listens on.
func (m *Membership) GossipAddr() string { return m.addr }

// Members returns the members believed alive (alive or suspect), sorted by
// id, and the snapshot's version. The slice is shared: do not modify it.
func (m *Membership) Members() ([]MemberInfo, uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.members, m.mu.version
}

// Member returns the live member id, if it is one.
func (m *Membership) Member(id string) (MemberInfo, bool) {
	ms, _ := m.Members()
	i, ok := slices.BinarySearchFunc(ms, id, func(mi MemberInfo, id string) int { return cmpString(mi.ID, id) })
	if !ok {
		return MemberInfo{}, false
	}
	return ms[i], true
}

// Subscribe returns a channel that receives a value (coalesced) after every
// membership change. It is never closed; it is dropped on Close.
func (m *Membership) Subscribe() <-chan struct{} {
	ch := make(chan struct{}, 1)
	m.mu.Lock()
	m.mu.subs = append(m.mu.subs, ch)
	m.mu.Unlock()
	return ch
}

// Leave tells the cluster this node is leaving and waits up to timeout for
// the message to spread. Close after it.
func (m *Membership) Leave(timeout time.Duration) error {
	m.life.Lock()
	defer m.life.Unlock()
	if m.life.closed {
		return errors.New("gossip: leave after the membership was closed")
	}
	if err := m.ml.Leave(timeout); err != nil {
		return fmt.Errorf("gossip: leave cluster: %w", err)
	}
	return nil
}

// Close stops gossip without announcing a leave (others detect the failure).
func (m *Membership) Close() error {
	m.closeOnce.Do(func() {
		close(m.stop)
		<-m.done
		m.life.Lock()
		defer m.life.Unlock()
		m.life.closed = true
		if err := m.ml.Shutdown(); err != nil {
			m.closeErr = fmt.Errorf("gossip: stop gossip: %w", err)
		}
	})
	return m.closeErr
}

// refresh rebuilds the sorted snapshot from the members the event
// callbacks recorded, and tells the subscribers.
func (m *Membership) refresh() {
	m.mu.Lock()
	infos := make([]MemberInfo, 0, len(m.mu.live))
	for _, mi := range m.mu.live {
		infos = append(infos, mi)
	}
	slices.SortFunc(infos, func(a, b MemberInfo) int { return cmpString(a.ID, b.ID) })
	m.mu.members = infos
	m.mu.version++
	subs := m.mu.subs
	m.mu.Unlock()
	for _, ch := range subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// delegate gossips this node's metadata; kvmesh sends no user messages.
type delegate Membership

func (d *delegate) NodeMeta(limit int) []byte {
	d.local.Lock()
	defer d.local.Unlock()
	if len(d.local.encoded) > limit {
		panic(fmt.Sprintf("gossip: member meta %d bytes over memberlist's limit %d", len(d.local.encoded), limit))
	}
	return d.local.encoded
}
func (d *delegate) NotifyMsg([]byte)                  {}
func (d *delegate) GetBroadcasts(_, _ int) [][]byte   { return nil }
func (d *delegate) LocalState(bool) []byte            { return nil }
func (d *delegate) MergeRemoteState(_ []byte, _ bool) {}

// events refreshes the snapshot on every change memberlist reports, and
// remembers the members that failed so that the reconnector tries them.
type events Membership

// The callbacks run with memberlist's node lock held: they copy what they
// need of n (memberlist hands out pointers into its state, which it changes
// under that lock) and never call memberlist.

func (e *events) NotifyJoin(n *memberlist.Node) {
	e.joins.Add(1)
	e.record(n, true)
	e.mu.Lock()
	delete(e.mu.failed, n.Name)
	e.mu.Unlock()
	e.changed()
}

func (e *events) NotifyLeave(n *memberlist.Node) {
	e.mu.Lock()
	delete(e.mu.live, n.Name)
	delete(e.mu.backlog, n.Name)
	if n.State == memberlist.StateDead && n.Name != e.name {
		e.mu.failed[n.Name] = failedMember{addr: n.Address(), since: time.Now()}
	}
	e.mu.Unlock()
	e.changed()
}

// NotifyUpdate records a member's new metadata; only a change of more than
// its backlog is a membership change.
func (e *events) NotifyUpdate(n *memberlist.Node) {
	if e.record(n, false) {
		e.changed()
	}
}

// record copies a live member into the map refresh builds snapshots from,
// and its backlog; it reports whether the member's MemberInfo changed
// (always, with join set).
func (e *events) record(n *memberlist.Node, join bool) (changed bool) {
	info := MemberInfo{ID: n.Name, GossipAddr: n.Address(), State: "alive"}
	var gm gossipMeta
	if err := json.Unmarshal(n.Meta, &gm); err != nil {
		e.log.Warn("member sent unreadable metadata; ignoring it", "member", n.Name, "err", err)
		return false
	}
	info.Meta = gm.MemberMeta
	e.mu.Lock()
	defer e.mu.Unlock()
	old, ok := e.mu.live[n.Name]
	e.mu.live[n.Name] = info
	if gm.Backlog != 0 {
		e.mu.backlog[n.Name] = gm.Backlog
	} else {
		delete(e.mu.backlog, n.Name)
	}
	return join || !ok || !reflect.DeepEqual(old, info)
}

// NotifyConflict reports two nodes claiming one id: placement cannot tell
// them apart, so this is an operator's mistake worth an error line.
func (e *events) NotifyConflict(existing, other *memberlist.Node) {
	e.log.Error("two nodes claim the same node id; give each a unique --node-id (or its own data dir)",
		"id", existing.Name, "member", existing.Address(), "other", other.Address())
}

func (e *events) changed() {
	select {
	case e.kick <- struct{}{}:
	default: // a refresh is already pending
	}
}

// logWriter turns memberlist's "[LEVEL] memberlist: msg" lines into slog
// records at the matching level.
type logWriter struct{ log *slog.Logger }

func (w *logWriter) Write(p []byte) (int, error) {
	line := bytes.TrimSpace(p)
	level := slog.LevelInfo
	for prefix, l := range map[string]slog.Level{"[DEBUG]": slog.LevelDebug, "[INFO]": slog.LevelInfo, "[WARN]": slog.LevelWarn, "[ERR]": slog.LevelError} {
		if bytes.HasPrefix(line, []byte(prefix)) {
			level = l
			line = bytes.TrimSpace(line[len(prefix):])
			break
		}
	}
	w.log.Log(context.Background(), level, string(line), "component", "gossip")
	return len(p), nil
}

var _ io.Writer = (*logWriter)(nil)
