package node

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
	"github.com/kvmesh/kvmesh/transfer"
)

// tenantsFile is a tokens file with two tenants, each with a read-write
// token, a read-only one and an admin one; an operator; and the nodes'
// cluster token. The admin of acme is given by its SHA-256.
func tenantsFile(t testing.TB) *auth.File {
	t.Helper()
	sum := sha256.Sum256([]byte("acme-admin"))
	f, err := auth.ParseFile([]byte(`
secret: "0123456789abcdef0123456789abcdef-test"
tokens:
  - {token: acme-rw, tenant: acme, scopes: [read, write]}
  - {token: acme-r, tenant: acme, scopes: [read]}
  - {sha256: "` + hex.EncodeToString(sum[:]) + `", tenant: acme, scopes: [read, admin]}
  - {token: beta-rw, tenant: beta, scopes: [read, write]}
  - {token: beta-admin, tenant: beta, scopes: [read, admin]}
  - {token: ops, scopes: [read, admin]}
  - {token: ops-rw, scopes: [read, write, admin]}
  - {token: node-to-node, scopes: [cluster, read, write]}
`))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// tenantDial returns a client of n presenting token.
func tenantDial(t testing.TB, n *clusterNode, token, transport string) *client.Client {
	t.Helper()
	c, err := client.Dial(n.GRPCAddr(), client.Options{Token: token, Transport: transport, MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// rawTenantAPI is a node's gRPC API presenting token.
func rawTenantAPI(t testing.TB, addr, token string) api {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(rawAuth("Bearer "+token)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return api{kvmeshv1.NewCacheServiceClient(conn), kvmeshv1.NewAdminServiceClient(conn)}
}

// TestTenantsIsolated: on a two-node cluster with a tokens file, one
// tenant's blocks reach that tenant through either node, and no path lets
// another tenant read, write over, describe, count or administer them, even
// knowing their exact keys.
func TestTenantsIsolated(t *testing.T) {
	tf := tenantsFile(t)
	nodes := startClusterNodes(t, 2, func(_ int, o *Options) {
		o.Security.TokensFile = tf
		o.Cluster.GossipKey = []byte("fedcba9876543210fedcba9876543210")
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const blocks = 8
	tokens, payloads := clusterPrompt(77, blocks)

	acme := tenantDial(t, nodes[0], "acme-rw", client.TransportTCP)
	if _, err := acme.Put(ctx, clusterNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
		t.Fatalf("acme puts its prompt: %v", err)
	}
	sess, err := acme.Session(ctx)
	if err != nil || sess.Tenant != "acme" || sess.Tag != auth.TagOf("acme") || sess.Salt == "" {
		t.Fatalf("acme's session: %+v, %v", sess, err)
	}
	acmeNS, _ := acme.Namespace(ctx, clusterNS)
	keys := prefixhash.Keys(acmeNS, tokens)

	// acme reads its prompt through the other node, both transports.
	for _, tr := range []string{client.TransportAuto, client.TransportGRPC} {
		c := tenantDial(t, nodes[1], "acme-r", tr)
		waitHit(t, c, tokens, blocks)
		got, err := c.Get(ctx, clusterNS, client.Prompt{Tokens: tokens})
		if err != nil || len(got) != blocks || string(got[3].Payload) != string(payloads[3]) {
			t.Fatalf("%s: acme reads its prompt through n1: %d blocks, %v", tr, len(got), err)
		}
	}

	// beta, with the same namespace and prompt, finds nothing anywhere.
	for i, n := range nodes {
		for _, tr := range []string{client.TransportAuto, client.TransportTCP, client.TransportGRPC} {
			beta := tenantDial(t, n, "beta-rw", tr)
			if l, err := beta.Lookup(ctx, clusterNS, client.Prompt{Tokens: tokens}); err != nil || l.CachedBlocks != 0 {
				t.Errorf("n%d %s: beta's lookup of acme's prompt: %d blocks, %v", i, tr, l.CachedBlocks, err)
			}
			if got, err := beta.Get(ctx, clusterNS, client.Prompt{Tokens: tokens}); err != nil || len(got) != 0 {
				t.Errorf("n%d %s: beta's get of acme's prompt: %d blocks, %v", i, tr, len(got), err)
			}
			// Not even with acme's exact keys.
			n := 0
			err := beta.GetKeys(ctx, acmeNS, keys, func(b client.Block) error {
				if b.Found {
					n++
				}
				return nil
			})
			if err != nil || n != 0 {
				t.Errorf("n%d %s: beta's get of acme's keys: %d found, %v", i, tr, n, err)
			}
			if present, err := beta.Exists(ctx, keys); err != nil || strings.Contains(fmt.Sprint(present), "true") {
				t.Errorf("n%d %s: beta's exists of acme's keys: %v, %v", i, tr, present, err)
			}
		}
	}

	// The data plane, raw: beta's token gets misses for acme's keys, over
	// TCP and shared memory, and its frames cannot widen its scope.
	betaTCP, err := transfer.NewClient(nodes[0].DataAddr(), &transfer.ClientOptions{Token: "beta-rw"})
	if err != nil {
		t.Fatal(err)
	}
	defer betaTCP.Close()
	betaShm, err := transfer.DialShm(ctx, nodes[0].ShmSocket(), &transfer.ShmClientOptions{Token: "beta-rw"})
	if err != nil {
		t.Fatal(err)
	}
	defer betaShm.Close()
	acmeTCP, err := transfer.NewClient(nodes[0].DataAddr(), &transfer.ClientOptions{Token: "acme-r"})
	if err != nil {
		t.Fatal(err)
	}
	defer acmeTCP.Close()
	for name, get := range map[string]func(context.Context, []prefixhash.Key) (*transfer.Result, error){
		"tcp": betaTCP.Get, "shm": betaShm.Get,
	} {
		for _, scope := range []context.Context{ctx, auth.WithAccess(ctx, auth.Access{Scoped: true, Tag: auth.TagOf("acme")})} {
			res, err := get(scope, keys)
			if err != nil {
				t.Fatalf("%s: beta's data-plane get: %v", name, err)
			}
			for i, st := range res.Status {
				if st == transfer.StatusOK {
					t.Errorf("%s: beta read acme's block %d over the data plane", name, i)
				}
			}
			res.Release()
		}
	}
	res, err := acmeTCP.Get(ctx, keys)
	if err != nil || res.Status[0] != transfer.StatusOK {
		t.Fatalf("acme's own data-plane get: %v, %v", res, err)
	}
	res.Release()
	if _, err := acmeTCP.Put(ctx, keys[:1], [][]byte{make([]byte, 64)}); !errors.Is(err, transfer.ErrAuth) {
		t.Errorf("a read-only token's data-plane put: %v, want ErrAuth", err)
	}

	// beta cannot write over acme's blocks: not tagged as acme, nor as itself
	// under acme's keys.
	block := encodeTenantBlock(t, acmeNS, acmeNS.Root(), tokens[:16], payloads[0], auth.TagOf("acme"))
	st, err := betaTCP.Put(ctx, keys[:1], [][]byte{block})
	if err != nil || st[0] == transfer.StatusOK {
		t.Errorf("beta's put of a block tagged acme: %v, %v", st, err)
	}
	block = encodeTenantBlock(t, acmeNS, acmeNS.Root(), tokens[:16], payloads[0], auth.TagOf("beta"))
	st, err = betaTCP.Put(ctx, keys[:1], [][]byte{block})
	if err != nil || st[0] == transfer.StatusOK {
		t.Errorf("beta's put over acme's key: %v, %v", st, err)
	}

	// Block info walks no other tenant's chain.
	betaAPI := rawTenantAPI(t, nodes[0].GRPCAddr(), "beta-rw")
	if _, err := betaAPI.admin.BlockInfo(ctx, &kvmeshv1.BlockInfoRequest{Key: keys[2][:]}); status.Code(err) != codes.NotFound {
		t.Errorf("beta's BlockInfo of acme's block: %v, want NotFound", err)
	}
	acmeAPI := rawTenantAPI(t, nodes[0].GRPCAddr(), "acme-r")
	if bi, err := acmeAPI.admin.BlockInfo(ctx, &kvmeshv1.BlockInfoRequest{Key: keys[2][:]}); err != nil || string(bi.GetParent()) != string(keys[1][:]) {
		t.Errorf("acme's BlockInfo of its block: %v, %v", bi, err)
	}

	// Stats, quotas and metrics name no other tenant's namespace.
	digest := acmeNS.Digest()
	hasDigest := func(st *kvmeshv1.StatsResponse) bool {
		for _, x := range st.GetNamespaces() {
			if x.GetDigest() == digest {
				return true
			}
		}
		return false
	}
	if st, err := betaAPI.cache.Stats(ctx, &kvmeshv1.StatsRequest{}); err != nil || hasDigest(st) || len(st.GetNamespaces()) != 0 {
		t.Errorf("beta's Stats: %v, %v", st.GetNamespaces(), err)
	}
	if st, err := acmeAPI.cache.Stats(ctx, &kvmeshv1.StatsRequest{}); err != nil || !hasDigest(st) {
		t.Errorf("acme's Stats lack its namespace: %v, %v", st.GetNamespaces(), err)
	}
	ops := rawTenantAPI(t, nodes[0].GRPCAddr(), "ops")
	if st, err := ops.cache.Stats(ctx, &kvmeshv1.StatsRequest{}); err != nil || !hasDigest(st) {
		t.Errorf("the operator's Stats lack acme's namespace: %v, %v", st.GetNamespaces(), err)
	}
	betaAdmin := rawTenantAPI(t, nodes[0].GRPCAddr(), "beta-admin")
	if q, err := betaAdmin.admin.Quotas(ctx, &kvmeshv1.QuotasRequest{}); err != nil || len(q.GetNamespaces()) != 0 {
		t.Errorf("beta's Quotas: %v, %v", q.GetNamespaces(), err)
	}
	// n1 knows acme's model (acme looked its prompt up there), n0 holds
	// its blocks: neither names either.
	for i, n := range nodes {
		if body := scrape(t, n.HTTPAddr()); strings.Contains(body, digestString(digest)) || strings.Contains(body, clusterNS.Model) ||
			(i == 0 && !strings.Contains(body, namespaceLabel(tf.LabelKey, digest))) {
			t.Errorf("n%d: /metrics names acme's digest or model in the clear, or its label is not keyed:\n%s", i, grep(body, "kvmesh_namespace"))
		}
	}

	// Quotas and drops: admin scope, own namespaces only.
	quota := &kvmeshv1.Quota{DramBytes: 1, NvmeBytes: 1}
	for name, tc := range map[string]struct {
		a      api
		req    *kvmeshv1.SetQuotaRequest
		want   codes.Code
		reason kvmeshv1.ErrorReason
	}{
		"rw token":                 {rawTenantAPI(t, nodes[0].GRPCAddr(), "acme-rw"), &kvmeshv1.SetQuotaRequest{Digest: digest, Quota: quota}, codes.PermissionDenied, kvmeshv1.ErrorReason_ERROR_REASON_SCOPE_MISSING},
		"other tenant's digest":    {betaAdmin, &kvmeshv1.SetQuotaRequest{Digest: digest, Quota: quota}, codes.PermissionDenied, kvmeshv1.ErrorReason_ERROR_REASON_NAMESPACE_FORBIDDEN},
		"unknown digest":           {betaAdmin, &kvmeshv1.SetQuotaRequest{Digest: 12345, Quota: quota}, codes.PermissionDenied, kvmeshv1.ErrorReason_ERROR_REASON_NAMESPACE_FORBIDDEN},
		"other tenant's namespace": {betaAdmin, &kvmeshv1.SetQuotaRequest{Namespace: client.NamespaceProto(acmeNS), Quota: quota}, codes.FailedPrecondition, 0},
		"drop by other's digest":   {betaAdmin, nil, codes.PermissionDenied, kvmeshv1.ErrorReason_ERROR_REASON_NAMESPACE_FORBIDDEN},
		"cluster method as tenant": {betaAdmin, nil, codes.PermissionDenied, kvmeshv1.ErrorReason_ERROR_REASON_SCOPE_MISSING},
	} {
		var err error
		switch name {
		case "drop by other's digest":
			_, err = tc.a.admin.DropNamespace(ctx, &kvmeshv1.DropNamespaceRequest{Digest: digest})
		case "cluster method as tenant":
			conn, _ := grpc.NewClient(nodes[0].GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(rawAuth("Bearer beta-admin")))
			_, err = kvmeshv1.NewPeerServiceClient(conn).Lookup(ctx, &kvmeshv1.PeerServiceLookupRequest{Keys: keys[0][:], Runs: []uint32{1}})
			conn.Close()
		default:
			_, err = tc.a.admin.SetQuota(ctx, tc.req)
		}
		if status.Code(err) != tc.want {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
		if tc.want != codes.OK && tc.reason != 0 {
			wantRefusal(t, err, tc.want, tc.reason)
		}
	}
	// beta's quota "on acme's namespace" named beta's own salted copy,
	// which holds no blocks: refused, and acme still reads every block.
	waitHit(t, tenantDial(t, nodes[0], "acme-r", client.TransportGRPC), tokens, blocks)
	acmeAdmin := rawTenantAPI(t, nodes[0].GRPCAddr(), "acme-admin")
	if r, err := acmeAdmin.admin.DropNamespace(ctx, &kvmeshv1.DropNamespaceRequest{Digest: digest}); err != nil || r.GetDroppedBlocks() == 0 {
		t.Errorf("acme's admin drops its own namespace: %v, %v", r, err)
	}

	// A read-only token cannot put through gRPC either.
	if _, err := tenantDial(t, nodes[0], "acme-r", client.TransportGRPC).Put(ctx, clusterNS, client.Prompt{Tokens: tokens}, payloads); status.Code(errors.Unwrap(err)) != codes.PermissionDenied {
		t.Errorf("a read-only token's BatchPut: %v, want PermissionDenied", err)
	}
}

// encodeTenantBlock encodes the block of tokens chained from parent under
// ns, tagged for tenant tag.
func encodeTenantBlock(t testing.TB, ns prefixhash.Namespace, parent prefixhash.Key, tokens []uint32, payload []byte, tag uint64) []byte {
	t.Helper()
	b, _, err := block.EncodeTenant(nil, tag, ns, parent, tokens, payload)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestTenantsPrefill: the engine runs a tenant's prompt in the tenant's
// namespace: a prefix one tenant prefilled is a hit for it on another node
// and for no other tenant, whose results it cannot read either; a queued
// prompt runs as its tenant's too.
func TestTenantsPrefill(t *testing.T) {
	tf := tenantsFile(t)
	nodes := startClusterNodes(t, 2, func(_ int, o *Options) {
		o.Security.TokensFile = tf
		o.Cluster.GossipKey = []byte("fedcba9876543210fedcba9876543210")
		o.Prefill.Model = tinyModel()
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tokens := make([]uint32, 100)
	for i := range tokens {
		tokens[i] = uint32(i*7) % 250
	}
	acme0 := tenantDial(t, nodes[0], "acme-rw", client.TransportAuto)
	first, err := acme0.Prefill(ctx, client.PrefillRequest{Tokens: tokens})
	if err != nil || first.Usage.CachedTokens != 0 {
		t.Fatalf("acme's first prefill: %+v, %v", first.Usage, err)
	}
	if err := nodes[0].prefill.engine.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	acme1 := tenantDial(t, nodes[1], "acme-rw", client.TransportAuto)
	eng, err := acme1.Engine(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const hit = 96 // 6 blocks of 16
	testkit.WaitFor(t, "acme's prefix to be seen from n1", func() bool {
		l, err := acme1.Lookup(ctx, eng.Namespace, client.Prompt{Tokens: tokens})
		return err == nil && l.CachedTokens == hit
	})
	again, err := acme1.Prefill(ctx, client.PrefillRequest{Tokens: tokens})
	if err != nil || again.Usage.CachedTokens != hit {
		t.Errorf("acme's prefill on n1: %+v, %v; want %d cached", again.Usage, err, hit)
	}
	beta := tenantDial(t, nodes[1], "beta-rw", client.TransportAuto)
	if l, err := beta.Lookup(ctx, eng.Namespace, client.Prompt{Tokens: tokens}); err != nil || l.CachedTokens != 0 {
		t.Errorf("beta's lookup of acme's prefilled prompt: %d cached, %v", l.CachedTokens, err)
	}
	other, err := beta.Prefill(ctx, client.PrefillRequest{Tokens: tokens})
	if err != nil || other.Usage.CachedTokens != 0 {
		t.Errorf("beta's prefill of acme's prompt: %+v, %v; want nothing cached", other.Usage, err)
	}
	// An open (node-wide) caller's namespace is not the tenant's either.
	ops := tenantDial(t, nodes[1], "node-to-node", client.TransportGRPC)
	if l, err := ops.Lookup(ctx, eng.Namespace, client.Prompt{Tokens: tokens}); err != nil || l.CachedTokens != 0 {
		t.Errorf("the unsalted namespace holds acme's prompt: %d cached, %v", l.CachedTokens, err)
	}

	// Queued: acme's request runs in acme's namespace; beta cannot read it.
	q, err := acme0.Prefill(ctx, client.PrefillRequest{Tokens: tokens, Queue: true})
	if err != nil {
		t.Fatal(err)
	}
	done, err := acme0.WaitResult(ctx, q.RequestID, 10*time.Millisecond)
	if err != nil || done.Usage.CachedTokens != hit {
		t.Errorf("acme's queued prefill: %+v, %v; want %d cached", done.Usage, err, hit)
	}
	if _, err := tenantDial(t, nodes[0], "beta-rw", client.TransportGRPC).GetResult(ctx, q.RequestID); status.Code(errors.Unwrap(err)) != codes.NotFound {
		t.Errorf("beta reads acme's queued result: %v, want NotFound", err)
	}
	if _, err := tenantDial(t, nodes[0], "acme-r", client.TransportGRPC).Prefill(ctx, client.PrefillRequest{Tokens: tokens}); status.Code(errors.Unwrap(err)) != codes.PermissionDenied {
		t.Errorf("a read-only token's prefill: %v, want PermissionDenied", err)
	}
}

// TestSetTokensFile: a reloaded tokens file adds and drops tokens at once;
// one whose secret or cluster token changed is refused and changes nothing.
func TestSetTokensFile(t *testing.T) {
	tf := tenantsFile(t)
	n := startNode(t, func(o *Options) { o.Security.TokensFile = tf })
	parse := func(body string) *auth.File {
		f, err := auth.ParseFile([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	whoami := func(token string) (string, error) {
		resp, err := rawTenantAPI(t, n.GRPCAddr(), token).admin.WhoAmI(context.Background(), &kvmeshv1.WhoAmIRequest{})
		return resp.GetTenant(), err
	}
	if tenant, err := whoami("acme-rw"); err != nil || tenant != "acme" {
		t.Fatalf("WhoAmI(acme-rw) = %q, %v", tenant, err)
	}
	const secret = `secret: "0123456789abcdef0123456789abcdef-test"`
	if err := n.SetTokensFile(parse(secret + "\ntokens:\n  - {token: gamma, tenant: gamma, scopes: [read]}\n  - {token: node-to-node, scopes: [cluster]}\n")); err != nil {
		t.Fatal(err)
	}
	if tenant, err := whoami("gamma"); err != nil || tenant != "gamma" {
		t.Errorf("a token added by a reload: %q, %v", tenant, err)
	}
	if _, err := whoami("acme-rw"); status.Code(err) != codes.Unauthenticated {
		t.Errorf("a token dropped by a reload: %v", err)
	}
	for name, body := range map[string]string{
		"secret":        `secret: "another secret of more than 32 characters"` + "\ntokens:\n  - {token: delta, tenant: delta, scopes: [read]}\n  - {token: node-to-node, scopes: [cluster]}\n",
		"cluster token": secret + "\ntokens:\n  - {token: delta, tenant: delta, scopes: [read]}\n  - {token: other-nodes, scopes: [cluster]}\n",
	} {
		if err := n.SetTokensFile(parse(body)); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("a reload that changes the %s: %v", name, err)
		}
		if _, err := whoami("delta"); status.Code(err) != codes.Unauthenticated {
			t.Errorf("a refused reload (%s) took effect: %v", name, err)
		}
	}
}

// TestReloadClosesRevoked: a reloaded tokens file that drops a token closes
// the data-plane and shared-memory connections it opened at once (a
// pooled connection would otherwise read on until it idled out); the
// tokens kept keep their connections.
func TestReloadClosesRevoked(t *testing.T) {
	tf := tenantsFile(t)
	n := openClusterNode(t, t.TempDir(), "n", nil, func(o *Options) {
		o.Security.TokensFile, o.Cluster.GossipKey = tf, []byte("fedcba9876543210fedcba9876543210")
	})
	ctx := context.Background()
	keys := []prefixhash.Key{{1}}
	tcp := map[string]*transfer.Client{}
	shm := map[string]*transfer.ShmClient{}
	for _, tok := range []string{"acme-r", "beta-rw"} {
		c, err := transfer.NewClient(n.DataAddr(), &transfer.ClientOptions{Token: tok, MaxConns: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if r, err := c.Get(ctx, keys); err != nil {
			t.Fatalf("%s: TCP get: %v", tok, err)
		} else {
			r.Release()
		}
		tcp[tok] = c
		if shm[tok], err = transfer.DialShm(ctx, n.ShmSocket(), &transfer.ShmClientOptions{Token: tok}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { shm[tok].Close() })
	}
	f, err := auth.ParseFile([]byte(`secret: "0123456789abcdef0123456789abcdef-test"
tokens:
  - {token: beta-rw, tenant: beta, scopes: [read, write]}
  - {token: node-to-node, scopes: [cluster, read, write]}
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := n.SetTokensFile(f); err != nil {
		t.Fatal(err)
	}
	if r, err := tcp["acme-r"].Get(ctx, keys); err == nil {
		r.Release()
		t.Error("a dropped token still reads on its open data-plane connection")
	}
	if r, err := shm["acme-r"].Get(ctx, keys); err == nil {
		r.Release()
		t.Error("a dropped token still reads on its open shared-memory connection")
	}
	if r, err := tcp["beta-rw"].Get(ctx, keys); err != nil {
		t.Errorf("a kept token's TCP get: %v", err)
	} else {
		r.Release()
	}
	if r, err := shm["beta-rw"].Get(ctx, keys); err != nil {
		t.Errorf("a kept token's shared-memory get: %v", err)
	} else {
		r.Release()
	}
}

// TestTenantCannotPlantNodeWide: a tenant writes, over the data plane and
// with its own tag, blocks under the keys and namespace digest of a
// node-wide prompt (neither is salted), and sets a 1-byte quota on that
// digest. A node-wide reader is not served them (its lookup and get miss);
// the node-wide write of the prompt takes the keys and the digest back and
// is not held to the tenant's quota; a quota on a digest the tenant holds
// nothing of is refused.
func TestTenantCannotPlantNodeWide(t *testing.T) {
	n := openClusterNode(t, t.TempDir(), "n", nil, func(o *Options) {
		o.Security.TokensFile, o.Cluster.GossipKey = tenantsFile(t), []byte("fedcba9876543210fedcba9876543210")
	})
	ctx := context.Background()
	const blocks = 4
	tokens, payloads := clusterPrompt(91, blocks)
	forged := make([][]byte, blocks)
	keys := make([]prefixhash.Key, blocks)
	vals := make([][]byte, blocks)
	parent := clusterNS.Root()
	for i := range blocks {
		forged[i] = bytes.Repeat([]byte{0x66}, len(payloads[i]))
		b, k, err := block.EncodeTenant(nil, auth.TagOf("acme"), clusterNS, parent, tokens[i*clusterNS.BlockTokens:(i+1)*clusterNS.BlockTokens], forged[i])
		if err != nil {
			t.Fatal(err)
		}
		keys[i], vals[i], parent = k, b, k
	}
	acme, err := transfer.NewClient(n.DataAddr(), &transfer.ClientOptions{Token: "acme-rw"})
	if err != nil {
		t.Fatal(err)
	}
	defer acme.Close()
	if st, err := acme.Put(ctx, keys, vals); err != nil || st[0] != transfer.StatusOK {
		t.Fatalf("the tenant's plant: %v %v", st, err)
	}
	acmeAdmin := rawTenantAPI(t, n.GRPCAddr(), "acme-admin")
	if _, err := acmeAdmin.admin.SetQuota(ctx, &kvmeshv1.SetQuotaRequest{Digest: clusterNS.Digest(), Quota: &kvmeshv1.Quota{DramBytes: 1, NvmeBytes: 1}}); err != nil {
		t.Fatalf("acme's quota on the digest it holds blocks of: %v", err)
	}
	if _, err := acmeAdmin.admin.SetQuota(ctx, &kvmeshv1.SetQuotaRequest{Digest: 0x1234, Quota: &kvmeshv1.Quota{DramBytes: 1}}); status.Code(err) == codes.OK {
		t.Error("a tenant's quota on a digest that holds nothing was accepted")
	}

	for _, transport := range []string{client.TransportGRPC, client.TransportTCP, client.TransportAuto} {
		ops := tenantDial(t, n, "ops", transport)
		if l, err := ops.Lookup(ctx, clusterNS, client.Prompt{Tokens: tokens}); err != nil || l.CachedBlocks != 0 {
			t.Errorf("%s: a node-wide lookup found %d of the tenant's blocks (%v)", transport, l.CachedBlocks, err)
		}
		if got, err := ops.Get(ctx, clusterNS, client.Prompt{Tokens: tokens}); err != nil || len(got) != 0 {
			t.Errorf("%s: a node-wide get was served %d of the tenant's blocks (%v)", transport, len(got), err)
		}
	}
	// Node-wide data takes its keys back, under no tenant's quota.
	opsRW := tenantDial(t, n, "ops-rw", client.TransportTCP)
	if _, err := opsRW.Put(ctx, clusterNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
		t.Fatalf("the node-wide put of the prompt: %v", err)
	}
	got, err := tenantDial(t, n, "ops", client.TransportGRPC).Get(ctx, clusterNS, client.Prompt{Tokens: tokens})
	if err != nil || len(got) != blocks {
		t.Fatalf("node-wide get after the put: %d blocks, %v", len(got), err)
	}
	for i := range got {
		if !bytes.Equal(got[i].Payload, payloads[i]) {
			t.Fatalf("block %d: the node-wide reader got the tenant's bytes", i)
		}
	}
}

//lint:file-ignore SA1019 the node's tests call the client's deprecated methods, kept one release (client/deprecated.go).
