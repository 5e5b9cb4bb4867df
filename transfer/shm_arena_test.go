//go:build linux

package transfer

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"golang.org/x/sys/unix"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/tiers"
)

// arenaSource is a Source, Reserver and Arena over a real tiers.DRAM, the
// shape of the node's store: an index of key → slot, pins that keep a slot
// from being freed while a reader holds it, and eviction that frees a slot
// only when its last pin goes. A committed value must be sealed: its last
// 8 bytes are the xxhash64 of the rest.
type arenaSource struct {
	d  *tiers.DRAM
	mu struct {
		sync.Mutex
		index     map[prefixhash.Key]arenaVal
		pins      map[tiers.Loc]int
		dead      map[tiers.Loc]bool // evicted while pinned: freed at the last unpin
		open      int                // reservations not yet committed or aborted
		published []prefixhash.Key
	}
}

type arenaVal struct {
	loc tiers.Loc
	n   int
}

var (
	_ Source   = (*arenaSource)(nil)
	_ Reserver = (*arenaSource)(nil)
	_ Arena    = (*arenaSource)(nil)
)

func newArenaSource(t testing.TB, capacity, slab int64) *arenaSource {
	t.Helper()
	d, err := tiers.NewDRAM(tiers.DRAMOptions{Capacity: capacity, SlabSize: slab})
	if err != nil {
		t.Fatal(err)
	}
	a := &arenaSource{d: d}
	a.mu.index = make(map[prefixhash.Key]arenaVal)
	a.mu.pins = make(map[tiers.Loc]int)
	a.mu.dead = make(map[tiers.Loc]bool)
	t.Cleanup(func() { d.Close() })
	return a
}

func (a *arenaSource) Arena() ([]byte, int) { return a.d.Arena() }

// sealed returns n bytes (n ≥ 8) of value i, sealed.
func sealed(i, n int) []byte {
	v := testValue(i, n)
	binary.LittleEndian.PutUint64(v[n-8:], xxhash.Sum64(v[:n-8]))
	return v
}

func isSealed(v []byte) bool {
	return len(v) >= 8 && binary.LittleEndian.Uint64(v[len(v)-8:]) == xxhash.Sum64(v[:len(v)-8])
}

// set stores v under k (as a copy into the arena).
func (a *arenaSource) set(t testing.TB, k prefixhash.Key, v []byte) {
	t.Helper()
	loc, err := a.d.Put(k, v)
	if err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	a.insertLocked(k, arenaVal{loc, len(v)})
	a.mu.Unlock()
}

func (a *arenaSource) insertLocked(k prefixhash.Key, v arenaVal) {
	if old, ok := a.mu.index[k]; ok {
		a.dropLocked(old.loc)
	}
	a.mu.index[k] = v
}

// evict drops k: its slot is freed now, or at its last unpin.
func (a *arenaSource) evict(k prefixhash.Key) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if v, ok := a.mu.index[k]; ok {
		delete(a.mu.index, k)
		a.dropLocked(v.loc)
	}
}

func (a *arenaSource) dropLocked(loc tiers.Loc) {
	if a.mu.pins[loc] > 0 {
		a.mu.dead[loc] = true
		return
	}
	a.d.Free(loc)
}

func (a *arenaSource) Acquire(_ context.Context, keys []prefixhash.Key, vals [][]byte, st []Status) func() {
	a.mu.Lock()
	defer a.mu.Unlock()
	var locs []tiers.Loc
	for i, k := range keys {
		if v, ok := a.mu.index[k]; ok {
			vals[i], st[i] = a.d.View(v.loc, v.n), StatusOK
			a.mu.pins[v.loc]++
			locs = append(locs, v.loc)
		}
	}
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, loc := range locs {
			if a.mu.pins[loc]--; a.mu.pins[loc] == 0 {
				delete(a.mu.pins, loc)
				if a.mu.dead[loc] {
					delete(a.mu.dead, loc)
					a.d.Free(loc)
				}
			}
		}
	}
}

func (a *arenaSource) Reserve(ctx context.Context, key, _, chunk prefixhash.Key, size int) (Reservation, error) {
	loc, buf, err := a.d.Reserve(key, size)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	a.mu.open++
	a.mu.Unlock()
	r := &arenaResv{a: a, key: key, chunk: chunk, loc: loc, buf: buf}
	r.stop = context.AfterFunc(ctx, r.Abort)
	return r, nil
}

// check fails unless nothing is pinned, no reservation is open, and the
// tier holds exactly the indexed values.
func (a *arenaSource) check(t testing.TB) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if s := a.d.Stats(); len(a.mu.pins) != 0 || a.mu.open != 0 || s.Values != int64(len(a.mu.index)) {
		t.Fatalf("%d slots pinned, %d reservations open, tier holds %d values for %d indexed",
			len(a.mu.pins), a.mu.open, s.Values, len(a.mu.index))
	}
}

type arenaResv struct {
	a     *arenaSource
	key   prefixhash.Key
	chunk prefixhash.Key // non-zero: published at commit
	loc   tiers.Loc
	buf   []byte
	stop  func() bool
	mu    sync.Mutex
	done  bool
}

func (r *arenaResv) Buf() []byte { return r.buf }

func (r *arenaResv) end() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return false
	}
	r.done = true
	r.stop()
	r.a.mu.Lock()
	r.a.mu.open--
	r.a.mu.Unlock()
	return true
}

func (r *arenaResv) Commit() error {
	if !r.end() {
		return errors.New("reservation ended")
	}
	if !isSealed(r.buf) {
		r.a.d.Free(r.loc)
		return fmt.Errorf("%w: value of %s is not sealed", ErrCorrupt, r.key)
	}
	r.a.mu.Lock()
	r.a.insertLocked(r.key, arenaVal{r.loc, len(r.buf)})
	if !r.chunk.IsZero() {
		r.a.mu.published = append(r.a.mu.published, r.key)
	}
	r.a.mu.Unlock()
	return nil
}

func (r *arenaResv) Abort() {
	if r.end() {
		r.a.d.Free(r.loc)
	}
}

func startArenaShm(t testing.TB, a *arenaSource, opts ShmServerOptions) (*ShmServer, string) {
	t.Helper()
	opts.Arena, opts.Reserver = a, a
	s, err := NewShmServer(a, nil, &opts, quietLog)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "data.sock")
	if err := s.Listen(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

// inMapping reports whether v lies in m.
func inMapping(v, m []byte) bool {
	p, base := uintptrOf(v), uintptrOf(m)
	return p >= base && p+uintptr(len(v)) <= base+uintptr(len(m))
}

// A get is answered in place, under a lease: the values are the arena's
// own bytes, and they stay unchanged while the client holds them, however
// the store evicts and reuses memory meanwhile.
func TestShmArenaGetInPlace(t *testing.T) {
	a := newArenaSource(t, 8<<20, 1<<20)
	srv, path := startArenaShm(t, a, ShmServerOptions{})
	c := dialShm(t, path, nil)
	if c.arena == nil || !c.arenaW {
		t.Fatal("a node-wide client was not given the writable arena")
	}
	sizes := []int{64 << 10, 100, 300 << 10}
	keys := make([]prefixhash.Key, len(sizes)+1)
	for i, n := range sizes {
		keys[i] = testKey(i)
		a.set(t, keys[i], sealed(i, n))
	}
	keys[len(sizes)] = testKey(99) // a miss
	r, err := c.Get(context.Background(), keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range sizes {
		if r.Status[i] != StatusOK || !bytes.Equal(r.Values[i], sealed(i, n)) {
			t.Fatalf("key %d: %s, wrong bytes", i, r.Status[i])
		}
		if !inMapping(r.Values[i], c.arena) {
			t.Fatalf("key %d: value was copied, not read in place", i)
		}
	}
	if r.Status[len(sizes)] != StatusMiss {
		t.Fatalf("missing key: %s", r.Status[len(sizes)])
	}
	if st := srv.Stats(); st.Leases != 1 || st.RegionUse != 0 {
		t.Fatalf("while held: %d leases, %d region bytes", st.Leases, st.RegionUse)
	}
	// Evict everything and fill the memory again: slots still leased must
	// not be reused.
	for _, k := range keys {
		a.evict(k)
	}
	for i := range 40 {
		if _, err := a.d.Put(testKey(1000+i), testValue(1000+i, 64<<10)); err != nil {
			break
		}
	}
	for i, n := range sizes {
		if !bytes.Equal(r.Values[i], sealed(i, n)) {
			t.Fatalf("key %d: a leased value changed under its reader", i)
		}
	}
	r.Release()
	testkit.WaitFor(t, "the lease to end", func() bool { return srv.Stats().Leases == 0 })
	a.mu.Lock()
	pinned := len(a.mu.pins) + len(a.mu.dead)
	a.mu.Unlock()
	if pinned != 0 {
		t.Fatalf("%d slots still pinned after Release", pinned)
	}
}

// A lease the client does not release ends at LeaseTimeout, counted.
func TestShmArenaLeaseExpires(t *testing.T) {
	a := newArenaSource(t, 4<<20, 1<<20)
	srv, path := startArenaShm(t, a, ShmServerOptions{LeaseTimeout: 20 * time.Millisecond})
	c := dialShm(t, path, nil)
	a.set(t, testKey(0), sealed(0, 4096))
	r, err := c.Get(context.Background(), []prefixhash.Key{testKey(0)})
	if err != nil || r.Hits() != 1 {
		t.Fatalf("get: %v", err)
	}
	testkit.WaitFor(t, "the lease to expire", func() bool {
		st := srv.Stats()
		return st.Leases == 0 && st.LeasesExpired == 1
	})
	a.check(t)
	r.Release() // late: harmless
	if st := srv.Stats(); st.Leases != 0 || st.LeasesExpired != 1 {
		t.Fatalf("after a late release: %+v", st)
	}
}

// Puts go through reservations: written in place by the client, verified
// and indexed by the server; a value that fails verification is refused
// and leaves nothing behind; publish requests publish what was stored.
func TestShmArenaPut(t *testing.T) {
	a := newArenaSource(t, 8<<20, 1<<20)
	srv, path := startArenaShm(t, a, ShmServerOptions{})
	c := dialShm(t, path, nil)
	ctx := context.Background()
	keys := []prefixhash.Key{testKey(0), testKey(1), testKey(2)}
	vals := [][]byte{sealed(0, 512<<10), sealed(1, 200), testValue(2, 4096)} // the last is not sealed
	st, err := c.Put(ctx, keys, vals)
	if err != nil {
		t.Fatal(err)
	}
	if st[0] != StatusOK || st[1] != StatusOK || st[2] != StatusError {
		t.Fatalf("statuses %v, want ok ok error", st)
	}
	r, err := c.Get(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if r.Status[i] != StatusOK || !bytes.Equal(r.Values[i], vals[i]) {
			t.Fatalf("key %d reads back wrong", i)
		}
	}
	if r.Status[2] != StatusMiss {
		t.Fatal("a refused commit left its key present")
	}
	r.Release()
	// Heads and payloads, published: written into the slot back to back.
	v := sealed(3, 8192)
	st, err = c.PutPublish(ctx, []prefixhash.Key{testKey(3)}, []prefixhash.Key{testKey(30)}, [][]byte{v[:100]}, [][]byte{v[100:]})
	if err != nil || st[0] != StatusOK {
		t.Fatalf("publish: %v %v", st, err)
	}
	a.mu.Lock()
	pub := a.mu.published
	a.mu.Unlock()
	if len(pub) != 1 || pub[0] != testKey(3) {
		t.Fatalf("published %v", pub)
	}
	if s := srv.Stats(); s.Puts != 3 || s.Reservations != 0 {
		t.Fatalf("server stats %+v", s)
	}
	testkit.WaitFor(t, "leases to end", func() bool { return srv.Stats().Leases == 0 })
	a.check(t)
	// No slot holds it: the value travels inline instead, which this
	// server (no Sink) refuses; nothing is left behind.
	big := sealed(4, 2<<20)
	st, err = c.Put(ctx, []prefixhash.Key{testKey(4)}, [][]byte{big})
	if err == nil && st[0] == StatusOK {
		t.Fatal("a value no slot holds was stored")
	}
	a.check(t)
}

// A tenant's client never gets the arena (it holds every tenant's blocks),
// nor does a node-wide reader: both read copies in their region.
func TestShmArenaRefusedToTenants(t *testing.T) {
	acme := auth.Principal{Tenant: "acme", Scopes: auth.All, Tag: auth.TagOf("acme")}
	reader := auth.Principal{Scopes: auth.Read}
	creds, _ := auth.Shared("node")
	creds = append(creds, auth.Credential{Sum: sha("acme"), Principal: acme}, auth.Credential{Sum: sha("reader"), Principal: reader})
	tokens, err := auth.NewCredentials(creds)
	if err != nil {
		t.Fatal(err)
	}
	a := newArenaSource(t, 4<<20, 1<<20)
	a.set(t, testKey(0), sealed(0, 4096))
	_, path := startArenaShm(t, a, ShmServerOptions{Tokens: tokens})
	for _, tc := range []struct {
		token           string
		arena, writable bool
	}{{"node", true, true}, {"acme", false, false}, {"reader", false, false}} {
		c := dialShm(t, path, &ShmClientOptions{Token: tc.token})
		if (c.arena != nil) != tc.arena || c.arenaW != tc.writable {
			t.Fatalf("%s: arena %v writable %v, want %v %v", tc.token, c.arena != nil, c.arenaW, tc.arena, tc.writable)
		}
		r, err := c.Get(context.Background(), []prefixhash.Key{testKey(0)})
		if err != nil {
			t.Fatal(err)
		}
		if r.Status[0] == StatusOK && inMapping(r.Values[0], c.arena) != tc.arena {
			t.Fatalf("%s: value in the arena: %v", tc.token, inMapping(r.Values[0], c.arena))
		}
		r.Release()
	}
}

// TestShmArenaReopenAttack: a client that may only read (a node-wide
// reader, a tenant) takes every descriptor the server sends it, reopens
// each through /proc/self/fd O_RDWR (a memfd's inode is mode 0777) and
// tries to map it writable and to write it. None of them is the arena, and
// none can be written: the blocks other clients read stay as stored. The
// writer, the positive control, is given the arena.
func TestShmArenaReopenAttack(t *testing.T) {
	acme := auth.Principal{Tenant: "acme", Scopes: auth.Read, Tag: auth.TagOf("acme")}
	creds, _ := auth.Shared("node")
	creds = append(creds, auth.Credential{Sum: sha("acme"), Principal: acme},
		auth.Credential{Sum: sha("reader"), Principal: auth.Principal{Scopes: auth.Read}})
	tokens, err := auth.NewCredentials(creds)
	if err != nil {
		t.Fatal(err)
	}
	a := newArenaSource(t, 4<<20, 1<<20)
	want := sealed(0, 4096)
	a.set(t, testKey(0), want)
	_, path := startArenaShm(t, a, ShmServerOptions{Tokens: tokens})
	_, afd := a.Arena()
	var arenaIno unix.Stat_t
	if err := unix.Fstat(afd, &arenaIno); err != nil {
		t.Fatal(err)
	}
	for _, token := range []string{"reader", "acme", "node"} {
		uc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		lim := Limits{}
		lim.EnsureDefaults()
		hl, mem, fds, err := receiveHello(context.Background(), uc, token, &lim)
		if err != nil {
			t.Fatalf("%s: hello: %v", token, err)
		}
		gotArena, wrote := false, false
		for _, fd := range fds {
			var st unix.Stat_t
			isArena := unix.Fstat(fd, &st) == nil && st.Dev == arenaIno.Dev && st.Ino == arenaIno.Ino
			gotArena = gotArena || isArena
			if token != "node" && reopenAndWrite(t, fd, isArena) {
				wrote = true
			}
			unix.Close(fd)
		}
		unix.Munmap(mem)
		uc.Close()
		if token == "node" {
			if !gotArena || hl.arena&arenaWritable == 0 {
				t.Errorf("the node-wide writer was not given the writable arena")
			}
			continue
		}
		if gotArena || hl.arena != 0 {
			t.Errorf("%s (may only read) was given a descriptor of the arena", token)
		}
		if wrote {
			t.Errorf("%s reopened a descriptor it was given and wrote through it", token)
		}
	}
	c := dialShm(t, path, &ShmClientOptions{Token: "node"})
	r, err := c.Get(context.Background(), []prefixhash.Key{testKey(0)})
	if err != nil || r.Status[0] != StatusOK || !bytes.Equal(r.Values[0], want) {
		t.Fatalf("the stored block after the attack: %v, changed %v", err, r.Status[0] != StatusOK || !bytes.Equal(r.Values[0], want))
	}
	r.Release()
}

// reopenAndWrite does what a hostile client does with a descriptor it was
// sent: reopen it read-write through /proc and write through a writable
// shared mapping or pwrite (of the bytes already there, so that a write
// that gets through changes nothing). It reports whether any did.
func reopenAndWrite(t *testing.T, fd int, isArena bool) bool {
	t.Helper()
	if seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0); !isArena && err == nil && seals&unix.F_SEAL_FUTURE_WRITE == 0 {
		// A region on a kernel before 5.1, which lacks the write seal:
		// writing it spoils only this client's own copies.
		t.Logf("descriptor %d is not sealed against writes (kernel before 5.1?): not attacked", fd)
		return false
	}
	rw, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return false // could not even reopen it
	}
	defer unix.Close(rw)
	var st unix.Stat_t
	if err := unix.Fstat(rw, &st); err != nil || st.Size == 0 {
		return false
	}
	wrote := false
	if m, err := unix.Mmap(rw, 0, int(min(st.Size, 1<<20)), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
		m[0] ^= 0xff // the first slot's first byte: where a block's header starts
		m[0] ^= 0xff
		wrote = true
		unix.Munmap(m)
	}
	last := make([]byte, 1)
	if _, err := unix.Pread(rw, last, st.Size-1); err == nil {
		if n, err := unix.Pwrite(rw, last, st.Size-1); err == nil && n == 1 {
			wrote = true
		}
	}
	return wrote
}

// A client process killed between reserving and committing leaves no
// reserved slot behind.
func TestShmArenaClientDeath(t *testing.T) {
	if os.Getenv("KVMESH_ARENA_CHILD") != "" {
		arenaChild()
		return
	}
	a := newArenaSource(t, 8<<20, 1<<20)
	srv, path := startArenaShm(t, a, ShmServerOptions{})
	cmd := exec.Command(os.Args[0], "-test.run=^TestShmArenaClientDeath$")
	cmd.Env = append(os.Environ(), "KVMESH_ARENA_CHILD="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "reserved\n" {
		t.Fatalf("child said %q, %v", line, err)
	}
	if st := srv.Stats(); st.Reservations != 2 || a.d.Stats().Values != 2 {
		t.Fatalf("while the child holds reservations: %d open, tier holds %d values", st.Reservations, a.d.Stats().Values)
	}
	cmd.Process.Kill()
	testkit.WaitFor(t, "the dead client's reservations to be freed", func() bool {
		st := srv.Stats()
		return st.Conns == 0 && st.Reservations == 0 && st.ReservationsAborted == 2
	})
	a.check(t)
	if a.d.Stats().Values != 0 {
		t.Fatal("the dead client's slots are still taken")
	}
}

// arenaChild reserves two slots, half fills one, says so, and waits to be
// killed.
func arenaChild() {
	c, err := DialShm(context.Background(), os.Getenv("KVMESH_ARENA_CHILD"), nil)
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(1)
	}
	rep, err := c.roundTrip(context.Background(), func(id uint64) net.Buffers {
		t := c.enc.begin(typeShmReserveReq, 2)
		putReserveEntry(t, 0, testKey(0), prefixhash.Key{}, prefixhash.Key{}, 512<<10)
		putReserveEntry(t, 1, testKey(1), prefixhash.Key{}, prefixhash.Key{}, 4096)
		c.bufs = append(c.bufs[:0], c.enc.finish(header{typ: typeShmReserveReq, id: id, count: 2}))
		return c.bufs
	})
	if err != nil || rep.h.typ != typeShmGetResp {
		fmt.Println("reserve:", err)
		os.Exit(1)
	}
	fmt.Println("reserved")
	time.Sleep(time.Hour) // until killed
}

// Gets (in place), puts (reserved) and evictions race; every value read is
// exactly what was stored under its key, and nothing leaks.
func TestShmArenaUnderEviction(t *testing.T) {
	a := newArenaSource(t, 4<<20, 512<<10)
	srv, path := startArenaShm(t, a, ShmServerOptions{})
	c := dialShm(t, path, nil)
	const keys = 64
	size := func(i int) int { return 8<<10 + (i%4)*(20<<10) }
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			ctx := context.Background()
			for range 150 {
				i := rng.IntN(keys)
				switch rng.IntN(4) {
				case 0:
					a.evict(testKey(i))
				case 1:
					if _, err := c.Put(ctx, []prefixhash.Key{testKey(i)}, [][]byte{sealed(i, size(i))}); err != nil {
						t.Error(err)
						return
					}
				default:
					r, err := c.Get(ctx, []prefixhash.Key{testKey(i), testKey((i + 1) % keys)})
					if err != nil {
						t.Error(err)
						return
					}
					for j, k := range []int{i, (i + 1) % keys} {
						if r.Status[j] == StatusOK && !bytes.Equal(r.Values[j], sealed(k, size(k))) {
							t.Errorf("key %d read back wrong", k)
						}
					}
					r.Release()
				}
			}
		}()
	}
	wg.Wait()
	testkit.WaitFor(t, "leases to end", func() bool { return srv.Stats().Leases == 0 })
	a.check(t)
}

// Put is the Sink of the copying path (no reservations): it verifies and
// copies each value into the arena, as the node did before reservations.
func (a *arenaSource) Put(_ context.Context, keys []prefixhash.Key, vals [][]byte, st []Status) {
	for i, k := range keys {
		if !isSealed(vals[i]) {
			st[i] = StatusError
			continue
		}
		loc, err := a.d.Put(k, vals[i])
		if err != nil {
			continue
		}
		a.mu.Lock()
		a.insertLocked(k, arenaVal{loc, len(vals[i])})
		a.mu.Unlock()
		st[i] = StatusOK
	}
}

// benchArena starts a server over a 256 MiB arena; inPlace shares the
// arena (reads in place, reserved puts), else values are copied (into the
// client's region; puts received inline and copied into the arena).
func benchArena(b *testing.B, inPlace bool) (*arenaSource, *ShmClient) {
	a := newArenaSource(b, 256<<20, 16<<20+64<<10)
	opts := &ShmServerOptions{}
	if inPlace {
		opts.Arena, opts.Reserver = a, a
	}
	s, err := NewShmServer(a, a, opts, quietLog)
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(b.TempDir(), "data.sock")
	if err := s.Listen(path); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return a, dialShm(b, path, nil)
}

// BenchmarkShmArenaPut measures puts of new sealed values, evicting as the
// arena fills: reserved and written in place, against received inline and
// copied (copy).
//
//	go test -run '^$' -bench 'ShmArena' -count 5 ./transfer/
func BenchmarkShmArenaPut(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20, 4 << 20} {
		for _, inPlace := range []bool{true, false} {
			b.Run(fmt.Sprintf("%s/%s", formatSize(size), map[bool]string{true: "in-place", false: "copy"}[inPlace]), func(b *testing.B) {
				a, c := benchArena(b, inPlace)
				v := sealed(0, size)
				keep := (128 << 20) / size
				b.SetBytes(int64(size))
				ctx := context.Background()
				for i := 0; b.Loop(); i++ {
					st, err := c.Put(ctx, []prefixhash.Key{testKey(i)}, [][]byte{v})
					if err != nil || st[0] != StatusOK {
						b.Fatal(st, err)
					}
					a.evict(testKey(i - keep))
				}
			})
		}
	}
}

// BenchmarkShmArenaGet measures gets of one value, each byte read by the
// caller (its checksum verified, as a careful reader does): in place under
// a lease, against copied into the region.
func BenchmarkShmArenaGet(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20, 4 << 20} {
		for _, inPlace := range []bool{true, false} {
			b.Run(fmt.Sprintf("%s/%s", formatSize(size), map[bool]string{true: "in-place", false: "copy"}[inPlace]), func(b *testing.B) {
				a, c := benchArena(b, inPlace)
				const n = 16
				for i := range n {
					a.set(b, testKey(i), sealed(i, size))
				}
				b.SetBytes(int64(size))
				ctx := context.Background()
				for i := 0; b.Loop(); i++ {
					r, err := c.Get(ctx, []prefixhash.Key{testKey(i % n)})
					if err != nil || r.Hits() != 1 {
						b.Fatal(err)
					}
					if !isSealed(r.Values[0]) {
						b.Fatal("value read back damaged")
					}
					r.Release()
				}
			})
		}
	}
}

func formatSize(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

// A Release is told to the server ahead of the client's next request, in
// the same write, so when that request is answered its lease has ended; a
// Release followed by no request reaches the server after releaseDelay.
func TestShmReleaseRidesNextRequest(t *testing.T) {
	a := newArenaSource(t, 8<<20, 1<<20)
	srv, path := startArenaShm(t, a, ShmServerOptions{})
	c := dialShm(t, path, nil)
	for i := range 2 {
		a.set(t, testKey(i), sealed(i, 64<<10))
	}
	get := func(i int) *Result {
		t.Helper()
		r, err := c.Get(context.Background(), []prefixhash.Key{testKey(i)})
		if err != nil || r.Status[0] != StatusOK || !bytes.Equal(r.Values[0], sealed(i, 64<<10)) {
			t.Fatalf("get %d: %v", i, err)
		}
		return r
	}
	r0 := get(0)
	r0.Release()
	r1 := get(1)
	if st := srv.Stats(); st.Leases != 1 {
		t.Fatalf("after a Release and the next Get: %d leases, want 1 (the release goes ahead of the get)", st.Leases)
	}
	r1.Release()
	testkit.WaitFor(t, "the last lease to end with no request after it", func() bool { return srv.Stats().Leases == 0 })
	if st := srv.Stats(); st.LeasesExpired != 0 {
		t.Fatalf("%d leases expired: a release was lost", st.LeasesExpired)
	}
}
