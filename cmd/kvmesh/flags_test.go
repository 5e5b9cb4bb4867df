package main

import (
	"bytes"
	"crypto/tls"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/store"
	"github.com/kvmesh/kvmesh/transfer/certtest"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"64MiB": 64 << 20, "1GiB": 1 << 30, "1.5GiB": 3 << 29, "4096": 4096, "10GB": 10e9,
		"512k": 512 << 10, "2 TiB": 2 << 40, "100b": 100, "0": 0, "16mib": 16 << 20,
	} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "-1", "1XB", "1e30GiB", "MiB"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) succeeded", in)
		}
	}
	for n, want := range map[int64]string{1 << 30: "1GiB", 10 << 30: "10GiB", 1536: "1.5KiB", 100: "100B", 0: "0B", 3 << 20: "3MiB"} {
		if got := formatSize(n); got != want {
			t.Errorf("formatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

// serveOptions runs kvmesh serve with args and env and returns the node
// options it would have served with.
func serveOptions(t *testing.T, env map[string]string, args ...string) (node.Options, error) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	var got node.Options
	c := newServeCmd(func(_ *cobra.Command, o node.Options, _ *slog.Logger) error {
		got = o
		return nil
	})
	c.SetArgs(args)
	c.SetOut(new(bytes.Buffer))
	c.SetErr(new(bytes.Buffer))
	c.SilenceErrors, c.SilenceUsage = true, true
	err := c.Execute()
	return got, err
}

func TestServeDefaults(t *testing.T) {
	o, err := serveOptions(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.DataDir != "kvmesh-data" || o.Listen.GRPCAddr != "127.0.0.1:7600" || o.Listen.HTTPAddr != "127.0.0.1:7601" ||
		o.Tiers.DRAMBytes != 1<<30 || o.Tiers.NVMeBytes != 10<<30 || len(o.Cluster.Join) != 0 {
		t.Fatalf("serve with no flags: %+v", o)
	}
}

// TestServeSpillOnStop: a graceful stop writes all of --dram to NVMe unless
// --spill-on-stop (flag, variable or config) bounds it, and 0 turns it off.
func TestServeSpillOnStop(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want int64
	}{
		{nil, nil, 1 << 30},
		{[]string{"--dram", "8GiB"}, nil, 8 << 30},
		{[]string{"--spill-on-stop", "2GiB"}, nil, 2 << 30},
		{[]string{"--spill-on-stop", "0"}, nil, -1},
		{nil, map[string]string{"KVMESH_SPILL_ON_STOP": "0"}, -1},
	} {
		o, err := serveOptions(t, tc.env, tc.args...)
		if err != nil {
			t.Fatal(err)
		}
		if o.Tiers.SpillOnStopBytes != tc.want {
			t.Errorf("serve %v (env %v): Tiers.SpillOnStopBytes %d, want %d", tc.args, tc.env, o.Tiers.SpillOnStopBytes, tc.want)
		}
	}
}

// TestServeLayers checks the precedence: flag, then KVMESH_* variable, then
// config file, then default.
func TestServeLayers(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "kvmesh.yaml")
	os.WriteFile(cfg, []byte(`
dram: 2GiB
nvme: 20GiB
data-dir: /from/config
request-timeout: 90s
max-batch-blocks: 99
grpc-addr: 127.0.0.1:0
`), 0o644)
	o, err := serveOptions(t, map[string]string{"KVMESH_DATA_DIR": "/from/env", "KVMESH_NVME": "30GiB", "KVMESH_CONFIG": cfg},
		"--dram", "3GiB", "--http-addr", "127.0.0.1:9999")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"Tiers.DRAMBytes": int64(3 << 30), "Tiers.NVMeBytes": int64(30 << 30), "DataDir": "/from/env",
		"Limits.RequestTimeout": 90 * time.Second, "Limits.MaxBatchBlocks": 99, "Listen.GRPCAddr": "127.0.0.1:0",
		"Listen.HTTPAddr": "127.0.0.1:9999",
	}
	for path, w := range want {
		v := reflect.ValueOf(o)
		for _, field := range strings.Split(path, ".") {
			v = v.FieldByName(field)
		}
		if got := v.Interface(); got != w {
			t.Errorf("%s = %v, want %v", path, got, w)
		}
	}
}

func TestServeRefusals(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("dram-size: 1GiB\n"), 0o644)
	badValue := filepath.Join(t.TempDir(), "bad-value.yaml")
	os.WriteFile(badValue, []byte("replicas: 9\n"), 0o644)
	emptyTokens := filepath.Join(t.TempDir(), "tokens")
	os.WriteFile(emptyTokens, []byte("# no token yet\n\n"), 0o600)
	tokens := writeTokenFile(t)
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, []string{"--dram", "lots"}, `"lots" is not a size`},
		{map[string]string{"KVMESH_NVME": "1MiB"}, nil, "KVMESH_NVME: 1048576 bytes cannot hold"},
		{nil, []string{"--nvme", "1MiB"}, "--nvme (or KVMESH_NVME)"},
		{nil, []string{"--shm-socket-mode", "rw"}, `--shm-socket-mode "rw": want permission bits in octal`},
		{nil, []string{"--shm-socket-mode", "0666"}, "--shm-socket-mode (or KVMESH_SHM_SOCKET_MODE): 0666 lets every user of the host connect"},
		{nil, []string{"--config", badValue}, "config file " + badValue + ": replicas: 9 is outside 1..8"},
		{nil, []string{"--tls-cert", "cert.pem"}, "--tls-cert and --tls-key"},
		{nil, []string{"--tls-ca", "ca.pem"}, "--tls-cert and --tls-key"},
		{nil, []string{"--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-client-auth"}, "--tls-client-auth needs --tls-ca"},
		{nil, []string{"--tls-cert", "/does/not/exist.pem", "--tls-key", "/does/not/exist.pem"}, "TLS flags"},
		{nil, []string{"--auth-token-file", "/does/not/exist"}, "--auth-token-file"},
		{nil, []string{"--auth-token-file", emptyTokens}, "holds no token"},
		{nil, []string{"--kv-events-addr", "127.0.0.1:5557"}, "--kv-events-addr"},
		{nil, []string{"--kv-events-replay-addr", "tcp://127.0.0.1:0"}, "--kv-events-replay-addr"},
		{nil, []string{"--kv-events-addr", "tcp://127.0.0.1:0", "--auth-token-file", tokens, "--insecure-gossip"}, "no authentication"},
		{nil, []string{"--quota-dram", "-1"}, "not a size"},
		{nil, []string{"--partial-ttl", "2h"}, "--partial-ttl"},
		{nil, []string{"--partial-ttl", "-1s"}, "--partial-ttl"},
		{nil, []string{"--claim-ttl", "1h"}, "--claim-ttl"},
		{nil, []string{"--config", bad}, `unknown key "dram-size"`},
		{nil, []string{"--config", "/does/not/exist.yaml"}, "no such file"},
		{nil, []string{"--join", "10.0.0.1:7603,nohost"}, "--join"},
		{nil, []string{"--gossip-key-file", "/does/not/exist"}, "--gossip-key-file"},
		{nil, []string{"--replicas", "9"}, "--replicas"},
		{nil, []string{"--gossip-profile", "wan"}, "--gossip-profile"},
		{nil, []string{"--log-level", "loud"}, "--log-level"},
		{nil, []string{"--chunk-bytes", "8MiB"}, "--chunk-bytes"},
		{nil, []string{"--ready-file", "/does/not/exist/kvmesh.ready"}, `--ready-file (or KVMESH_READY_FILE): directory "/does/not/exist" does not exist`},
		{map[string]string{"KVMESH_READY_FILE": "/does/not/exist/r"}, nil, "KVMESH_READY_FILE: directory"},
		{nil, []string{"--ready-file", os.TempDir()}, "is a directory"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			_, err := serveOptions(t, tc.env, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("serve %v (env %v): %v; want one line mentioning %q", tc.args, tc.env, err, tc.want)
			}
		})
	}
}

func TestServeCluster(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "gossip.key")
	os.WriteFile(keyFile, []byte("MDEyMzQ1Njc4OWFiY2RlZg==\n"), 0o600)
	o, err := serveOptions(t, map[string]string{"KVMESH_REPLICAS": "2"},
		"--join", "10.0.0.1:7603,10.0.0.2:7603", "--gossip-key-file", keyFile, "--chunk-tokens", "256", "--lookup-timeout", "50ms",
		"--lookup-round-peers", "-1", "--shm-socket", "off", "--gossip-profile", "local")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(o.Cluster.Join, []string{"10.0.0.1:7603", "10.0.0.2:7603"}) || string(o.Cluster.GossipKey) != "0123456789abcdef" ||
		o.Cluster.Replicas != 2 || o.Cluster.ChunkTokens != 256 || o.Cluster.LookupTimeout != 50*time.Millisecond || o.Cluster.LookupRoundPeers != -1 || o.Listen.ShmSocket != node.ShmOff || o.Cluster.GossipProfile != "local" {
		t.Fatalf("cluster flags: %+v", o)
	}
	if o, err = serveOptions(t, nil); err != nil || o.Cluster.LookupRoundPeers != store.DefaultLookupRoundPeers {
		t.Fatalf("default --lookup-round-peers: %d, %v", o.Cluster.LookupRoundPeers, err)
	}
}

func TestTokens(t *testing.T) {
	if got := textTokens("hé!"); !reflect.DeepEqual(got, []uint32{'h', 0xc3, 0xa9, '!'}) {
		t.Errorf("textTokens = %v", got)
	}
	if got, err := parseTokens("1, 2,3,"); err != nil || !reflect.DeepEqual(got, []uint32{1, 2, 3}) {
		t.Errorf("parseTokens = %v, %v", got, err)
	}
	for _, in := range []string{"1,x", "-1", "4294967296", ",1"} {
		if _, err := parseTokens(in); err == nil {
			t.Errorf("parseTokens(%q) succeeded", in)
		}
	}
}

func TestRunErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"inspect", "stats", "--addr", "127.0.0.1:1", "--timeout", "3s"}, "no kvmesh node answers at 127.0.0.1:1"},
		{[]string{"inspect", "lookup"}, "--text T or as --tokens"},
		{[]string{"inspect", "stats", "-o", "yaml"}, "want table or json"},
		{[]string{"inspect", "lookup", "--text", "hi", "--layers", "0"}, "layers"},
		{[]string{"serve", "--bogus"}, "unknown flag: --bogus; see 'kvmesh serve --help'"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr)
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		if code != 1 || len(lines) != 1 || !strings.Contains(lines[0], tc.want) {
			t.Errorf("kvmesh %v: exit %d, stderr %q; want exit 1 and one line with %q", tc.args, code, stderr.String(), tc.want)
		}
	}
	var stdout bytes.Buffer
	if code := run([]string{"version"}, &stdout, &stdout); code != 0 || !strings.HasPrefix(stdout.String(), "kvmesh ") {
		t.Errorf("kvmesh version: exit %d, %q", code, stdout.String())
	}
}

func TestInspectEnv(t *testing.T) {
	t.Setenv("KVMESH_ADDR", "127.0.0.1:1")
	t.Setenv("KVMESH_TIMEOUT", "3s")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"inspect", "members"}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "at 127.0.0.1:1;") {
		t.Fatalf("KVMESH_ADDR=127.0.0.1:1 kvmesh inspect members: exit %d, %q", code, stderr.String())
	}
}

// TestServeSecurity: the TLS and token flags, from the command line, the
// environment and the config file, become the node's TLS configurations
// (mutual TLS with --tls-client-auth), its tokens and its default quotas.
func TestServeSecurity(t *testing.T) {
	if o, err := serveOptions(t, nil); err != nil || o.Security.TLS != nil || o.Security.PeerTLS != nil || o.Security.Tokens != nil {
		t.Errorf("no security flags: TLS %v, peer %v, tokens %v, %v", o.Security.TLS, o.Security.PeerTLS, o.Security.Tokens, err)
	}
	dir := t.TempDir()
	ca := certtest.NewCA(t, dir, "kvmesh")
	cert, key := ca.Issue(t, dir, "node", "127.0.0.1")
	tokens := filepath.Join(dir, "tokens")
	os.WriteFile(tokens, []byte("# current\nfirst-token\nsecond-token\n"), 0o600)
	cfg := filepath.Join(dir, "kvmesh.yaml")
	os.WriteFile(cfg, []byte("tls-key: "+key+"\ntls-client-auth: true\nquota-nvme: 2GiB\n"), 0o644)
	o, err := serveOptions(t, map[string]string{"KVMESH_TLS_CA": ca.File, "KVMESH_AUTH_TOKEN_FILE": tokens},
		"--config", cfg, "--tls-cert", cert, "--tls-server-name", "kvmesh.internal", "--quota-dram", "512MiB")
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case o.Security.TLS == nil || o.Security.TLS.GetCertificate == nil || o.Security.TLS.ClientAuth != tls.RequireAndVerifyClientCert || o.Security.TLS.ClientCAs == nil:
		t.Errorf("server TLS: %+v", o.Security.TLS)
	case o.Security.PeerTLS == nil || o.Security.PeerTLS.RootCAs == nil || o.Security.PeerTLS.GetClientCertificate == nil || o.Security.PeerTLS.ServerName != "kvmesh.internal":
		t.Errorf("peer TLS: %+v", o.Security.PeerTLS)
	case !reflect.DeepEqual(o.Security.Tokens, []string{"first-token", "second-token"}):
		t.Errorf("tokens: %q", o.Security.Tokens)
	case o.Tiers.QuotaDRAMBytes != 512<<20 || o.Tiers.QuotaNVMeBytes != 2<<30:
		t.Errorf("quotas: %d, %d", o.Tiers.QuotaDRAMBytes, o.Tiers.QuotaNVMeBytes)
	}
}

// TestParseConfig: a config file that is not a flat mapping of flag names
// to values is refused with one line naming the key (and its line) at
// fault; lists become comma-separated values.
func TestParseConfig(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"dram: {size: 1GiB}\n", `"dram": line 1: want a value or a list of values, not a mapping`},
		{"join: [a:1, [b:2]]\n", `"join": line 1: item 2 is a list`},
		{"dram: 1GiB\nnvme: 2GiB\ndram: 2GiB\n", `"dram": given twice (lines 1 and 3)`},
		{"- dram\n- nvme\n", "line 1: want a mapping of flag names to values"},
		{"? [a, b]\n: 1\n", "line 1: a key must be a flag name, not a list"},
		{"dram: 1GiB\n  nvme: 2GiB\n", "config file c.yaml: yaml: line 2"},
		{"dram: \"a\\nb\"\n", `"dram": line 1: want a one-line value`},
		{"\tdram: 1\n", "config file c.yaml: yaml"},
	} {
		_, err := parseConfig([]byte(tc.in), "c.yaml")
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("parseConfig(%q) = %v; want one line with %q", tc.in, err, tc.want)
		}
	}
	for in, want := range map[string]map[string]string{
		"":                   nil,
		"# only a comment\n": nil,
		"~\n":                nil,
		"join: [a:1, b:2]\ndram: 8GiB\nshm-socket:\n": {"join": "a:1,b:2", "dram": "8GiB", "shm-socket": ""},
		"base: &b 1GiB\ndram: *b\n":                   {"base": "1GiB", "dram": "1GiB"},
		"tls-client-auth: true\nreplicas: 2\n":        {"tls-client-auth": "true", "replicas": "2"},
	} {
		got, err := parseConfig([]byte(in), "c.yaml")
		if err != nil || len(got) != len(want) || (len(want) > 0 && !reflect.DeepEqual(got, want)) {
			t.Errorf("parseConfig(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
}

// FuzzConfig feeds any bytes to the config file decoder and the serve
// command's layering and option checks: none may panic, and every refusal
// is one line; a refusal of a decoded file names the file.
func FuzzConfig(f *testing.F) {
	for _, s := range []string{
		"dram: 8GiB\nnvme: 200GiB\njoin: [10.0.0.4:7603, 10.0.0.6:7603]\n",
		"data-dir: /var/lib/kvmesh\ngrpc-addr: 0.0.0.0:7600\nmax-block-bytes: 32MiB\n",
		"replicas: 9\n", "dram: {a: 1}\n", "- a\n", "a: &x [*x]\n", "quota-dram: 1GiB\ntls-client-auth: yes\n",
		"log-level: loud\n", "chunk-bytes: 8MiB\n", "request-timeout: -1s\n", "\xff: 1\n", "!!binary aGVsbG8=: 1\n",
	} {
		f.Add([]byte(s))
	}
	noEnv := func(string) (string, bool) { return "", false }
	files := []string{"gossip-key-file", "tls-cert", "tls-key", "tls-ca", "auth-token-file"}
	f.Fuzz(func(t *testing.T, data []byte) {
		oneLine := func(stage string, err error) {
			if strings.ContainsAny(err.Error(), "\n\r") {
				t.Fatalf("%s: error of more than one line: %q", stage, err)
			}
		}
		cfg, err := parseConfig(data, "f.yaml")
		if err != nil {
			oneLine("parseConfig", err)
			if !strings.HasPrefix(err.Error(), "config file f.yaml: ") {
				t.Fatalf("parseConfig: %q does not name the file", err)
			}
			return
		}
		for _, k := range files {
			if _, ok := cfg[k]; ok {
				return // the checks below would read the files it names
			}
		}
		c, sf := newServeCommand(nil)
		c.SetErr(io.Discard)
		if sf.from, err = layer(c.Flags(), noEnv, cfg, "f.yaml"); err != nil {
			oneLine("layer", err)
			if !strings.HasPrefix(err.Error(), "config file f.yaml: ") {
				t.Fatalf("layer: %q does not name the file", err)
			}
			return
		}
		if _, _, err := sf.build(c); err != nil {
			oneLine("build", err)
		}
	})
}

// TestServeLimitFlags: the limit and gossip flags reach node.Options from
// the command line, the environment and the config file alike.
func TestServeLimitFlags(t *testing.T) {
	o, err := serveOptions(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.Cluster.InsecureGossip || o.Limits.MaxConcurrentStreams != 256 || o.Limits.MaxInFlightBytes != 256<<20 {
		t.Fatalf("defaults: InsecureGossip %v, MaxConcurrentStreams %d, MaxInFlightBytes %d", o.Cluster.InsecureGossip, o.Limits.MaxConcurrentStreams, o.Limits.MaxInFlightBytes)
	}
	cfg := filepath.Join(t.TempDir(), "kvmesh.yaml")
	os.WriteFile(cfg, []byte("max-inflight-bytes: 512MiB\n"), 0o600)
	o, err = serveOptions(t, map[string]string{"KVMESH_INSECURE_GOSSIP": "true", "KVMESH_CONFIG": cfg}, "--max-concurrent-streams", "32")
	if err != nil {
		t.Fatal(err)
	}
	if !o.Cluster.InsecureGossip || o.Limits.MaxConcurrentStreams != 32 || o.Limits.MaxInFlightBytes != 512<<20 {
		t.Fatalf("set: InsecureGossip %v, MaxConcurrentStreams %d, MaxInFlightBytes %d", o.Cluster.InsecureGossip, o.Limits.MaxConcurrentStreams, o.Limits.MaxInFlightBytes)
	}
}

// TestNamespaceFlags: the layout, scales, LoRA and key-scheme flags make
// the namespace they name; a bad value is refused naming its flag.
func TestNamespaceFlags(t *testing.T) {
	parse := func(args ...string) (string, error) {
		var nf namespaceFlags
		c := &cobra.Command{Use: "x"}
		nf.register(c)
		if err := c.Flags().Parse(args); err != nil {
			return "", err
		}
		ns, err := nf.namespace()
		return ns.String(), err
	}
	ok := map[string][]string{
		"kvmesh/demo/float32/b16/l2/latent576":                {"--kv-layout", "latent", "--latent-dim", "576"},
		"kvmesh/demo/int8/b16/l2/kv2x16/scales-head/lora-sql": {"--dtype", "int8", "--scales", "head", "--lora", "sql"},
		"kvmesh/demo/float32/b16/l2/kv2x16/vllm":              {"--key-scheme", "vllm", "--hash-seed", "0"},
		"kvmesh/demo/fp8_e4m3/b16/l2/latent64/scales-block":   {"--kv-layout", "latent", "--latent-dim", "64", "--dtype", "fp8_e4m3", "--scales", "block"},
	}
	for want, args := range ok {
		if got, err := parse(args...); err != nil || got != want {
			t.Errorf("%v: namespace %s, %v; want %s", args, got, err, want)
		}
	}
	bad := map[string][]string{
		"--kv-layout":  {"--kv-layout", "mla"},
		"--scales":     {"--scales", "tensor"},
		"--key-scheme": {"--key-scheme", "lmcache"},
		"latent_dim":   {"--kv-layout", "latent"},
		"hash_seed":    {"--key-scheme", "vllm"},
	}
	for field, args := range bad {
		if _, err := parse(args...); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%v: err %v, want one naming %s", args, err, field)
		}
	}
}

// TestServeQueueFlags: --queue-share, --queue-steal-interval and
// --queue-lease reach BatchOptions; 0 (or less) means none or never.
func TestServeQueueFlags(t *testing.T) {
	o, err := serveOptions(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b := o.Prefill.Batch; b.Share != 1 || b.StealInterval != time.Second || b.LeaseTTL != 30*time.Second {
		t.Fatalf("defaults: %+v", b)
	}
	o, err = serveOptions(t, nil, "--queue-share", "0.5", "--queue-steal-interval", "200ms", "--queue-lease", "5s")
	if err != nil {
		t.Fatal(err)
	}
	if b := o.Prefill.Batch; b.Share != 0.5 || b.StealInterval != 200*time.Millisecond || b.LeaseTTL != 5*time.Second {
		t.Fatalf("set: %+v", b)
	}
	o, err = serveOptions(t, nil, "--queue-share", "0", "--queue-steal-interval", "0")
	if err != nil {
		t.Fatal(err)
	}
	if b := o.Prefill.Batch; b.Share >= 0 || b.StealInterval >= 0 {
		t.Fatalf("--queue-share 0 --queue-steal-interval 0: %+v, want both negative (none, never)", b)
	}
	if _, err := serveOptions(t, nil, "--queue-share", "2"); err == nil || !strings.Contains(err.Error(), "--queue-share") {
		t.Errorf("--queue-share 2: %v", err)
	}
}

// TestServeSpeculativeFlags: --speculative, --speculative-tokens and
// --speculative-draft set the engine's speculative decoding; bad values
// are refused naming the flag.
func TestServeSpeculativeFlags(t *testing.T) {
	o, err := serveOptions(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p := o.Prefill; p.Speculative != "off" || p.SpeculativeTokens != 4 || p.DraftDir != "" {
		t.Fatalf("defaults: %q, %d, %q", p.Speculative, p.SpeculativeTokens, p.DraftDir)
	}
	o, err = serveOptions(t, nil, "--speculative", "draft", "--speculative-tokens", "6", "--speculative-draft", "/models/draft")
	if err != nil {
		t.Fatal(err)
	}
	if p := o.Prefill; p.Speculative != "draft" || p.SpeculativeTokens != 6 || p.DraftDir != "/models/draft" {
		t.Fatalf("set: %q, %d, %q", p.Speculative, p.SpeculativeTokens, p.DraftDir)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--speculative", "medusa"}, "--speculative"},
		{[]string{"--speculative", "ngram", "--speculative-tokens", "17"}, "--speculative-tokens"},
		{[]string{"--speculative", "draft"}, "--speculative-draft"},
	} {
		if _, err := serveOptions(t, nil, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("serve %v: %v, want an error naming %s", tc.args, err, tc.want)
		}
	}
}

// TestSystemdUnit: the settings deploy/systemd/kvmesh.service gives kvmesh
// serve (its Environment= lines and ExecStart's flags) are accepted, and
// share the shared-memory socket with a group, 0660.
func TestSystemdUnit(t *testing.T) {
	b, err := os.ReadFile("../../deploy/systemd/kvmesh.service")
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	var args []string
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if kv, ok := strings.CutPrefix(line, "Environment="); ok {
			k, v, _ := strings.Cut(kv, "=")
			if k != "KVMESH_CONFIG" { // /etc/kvmesh/kvmesh.yaml is the host's
				env[k] = v
			}
		}
		if cmd, ok := strings.CutPrefix(line, "ExecStart="); ok {
			_, rest, _ := strings.Cut(cmd, " serve")
			// The ready file's directory is the host's /run/kvmesh.
			args = strings.Fields(strings.ReplaceAll(rest, "/run/kvmesh", t.TempDir()))
		}
	}
	if len(env) == 0 || args == nil {
		t.Fatalf("no Environment= or ExecStart= in the unit")
	}
	o, err := serveOptions(t, env, args...)
	if err != nil {
		t.Fatalf("the unit's settings: %v", err)
	}
	if o.Listen.ShmSocketGroup != "kvmesh-clients" || o.Listen.ShmSocketMode != 0o660 || o.Listen.ShmSocket != "/run/kvmesh/shm/shm.sock" {
		t.Errorf("the unit's shared-memory socket: %s, group %q, mode %#o", o.Listen.ShmSocket, o.Listen.ShmSocketGroup, uint32(o.Listen.ShmSocketMode))
	}
}
