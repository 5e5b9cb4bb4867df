package chartcheck

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

const chartDir = "../helm/kvmesh"

// manifestsFile holds the chart's default render as plain manifests.
const manifestsFile = "../kubernetes/kvmesh.yaml"

var update = flag.Bool("update", false, "rewrite "+manifestsFile+" from the chart's defaults")

// valueSets are the documented sets of values: the chart's defaults and
// each file of its ci/ directory (docs/OPERATIONS.md names them).
func valueSets(t *testing.T) map[string]string {
	t.Helper()
	sets := map[string]string{"defaults": ""}
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		sets[filepath.Base(f)] = f
	}
	if len(sets) < 3 {
		t.Fatalf("found %d value sets; want the defaults and the files of ci/", len(sets))
	}
	return sets
}

// render renders the chart with the values file (none: the defaults) as
// helm template would, and returns each template's output.
func render(t *testing.T, valuesFile string) map[string]string {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]any{}
	if valuesFile != "" {
		if vals, err = chartutil.ReadValuesFile(valuesFile); err != nil {
			t.Fatal(err)
		}
	}
	opts := chartutil.ReleaseOptions{Name: "kvmesh", Namespace: "kvmesh", Revision: 1, IsInstall: true}
	top, err := chartutil.ToRenderValues(ch, vals, opts, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	out, err := engine.Render(ch, top)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return out
}

// objects splits rendered or plain YAML into its documents, skipping empty
// ones.
func objects(t *testing.T, name, text string) [][]byte {
	t.Helper()
	var docs [][]byte
	r := utilyaml.NewYAMLReader(bufioReader(text))
	for {
		doc, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) > 0 {
			docs = append(docs, doc)
		}
	}
	return docs
}

// serviceMonitor is the part of the Prometheus operator's ServiceMonitor
// the chart writes; not in k8s.io/api, so checked against this instead.
type serviceMonitor struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		Endpoints []struct {
			Port      string `json:"port"`
			Path      string `json:"path"`
			Interval  string `json:"interval"`
			Scheme    string `json:"scheme,omitempty"`
			TLSConfig *struct {
				CA struct {
					Secret struct {
						Name string `json:"name"`
						Key  string `json:"key"`
					} `json:"secret"`
				} `json:"ca"`
				ServerName string `json:"serverName,omitempty"`
			} `json:"tlsConfig,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// validate decodes one object strictly into its Kubernetes type and returns
// its kind/name.
func validate(doc []byte) (string, error) {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		return "", err
	}
	var obj any
	switch head.APIVersion + " " + head.Kind {
	case "apps/v1 StatefulSet":
		obj = new(appsv1.StatefulSet)
	case "apps/v1 DaemonSet":
		obj = new(appsv1.DaemonSet)
	case "v1 Service":
		obj = new(corev1.Service)
	case "v1 ConfigMap":
		obj = new(corev1.ConfigMap)
	case "v1 Secret":
		obj = new(corev1.Secret)
	case "v1 ServiceAccount":
		obj = new(corev1.ServiceAccount)
	case "policy/v1 PodDisruptionBudget":
		obj = new(policyv1.PodDisruptionBudget)
	case "monitoring.coreos.com/v1 ServiceMonitor":
		obj = new(serviceMonitor)
	default:
		return "", fmt.Errorf("apiVersion %q kind %q: not a type this check knows", head.APIVersion, head.Kind)
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return "", fmt.Errorf("%s: %w", head.Kind, err)
	}
	var meta struct {
		Metadata struct{ Name string } `json:"metadata"`
	}
	_ = yaml.Unmarshal(doc, &meta)
	if meta.Metadata.Name == "" {
		return "", fmt.Errorf("%s without a name", head.Kind)
	}
	return head.Kind + "/" + meta.Metadata.Name, nil
}

// TestChart renders the chart for each documented set of values, lints it
// as helm lint does, and validates every object it renders.
func TestChart(t *testing.T) {
	for name, file := range valueSets(t) {
		t.Run(name, func(t *testing.T) {
			vals := map[string]any{}
			if file != "" {
				var err error
				if vals, err = chartutil.ReadValuesFile(file); err != nil {
					t.Fatal(err)
				}
			}
			linter := lint.AllWithKubeVersion(chartDir, vals, "kvmesh", nil)
			for _, m := range linter.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("helm lint: %s", m)
				}
			}
			out := render(t, file)
			kinds := map[string]bool{}
			var names []string
			for tmpl, text := range out {
				for _, doc := range objects(t, tmpl, text) {
					id, err := validate(doc)
					if err != nil {
						t.Errorf("%s: %v\n%s", tmpl, err, doc)
						continue
					}
					names = append(names, id)
					kinds[strings.SplitN(id, "/", 2)[0]] = true
				}
			}
			sort.Strings(names)
			t.Logf("rendered: %s", strings.Join(names, ", "))
			for _, want := range []string{"ConfigMap", "Service", "PodDisruptionBudget"} {
				if !kinds[want] {
					t.Errorf("no %s rendered", want)
				}
			}
			if !kinds["StatefulSet"] && !kinds["DaemonSet"] {
				t.Errorf("neither a StatefulSet nor a DaemonSet rendered")
			}
		})
	}
}

// TestChartRefuses: values the chart cannot honour fail the render with a
// message that says what to do.
func TestChartRefuses(t *testing.T) {
	for _, tc := range []struct{ values, want string }{
		{"kind: Deployment\n", "want StatefulSet or DaemonSet"},
		{"tls:\n  enabled: true\n", "tls.existingSecret"},
		{"auth:\n  tokens: [t]\n", "auth needs a gossip key"},
		{"auth:\n  existingSecret: t\n  tenants: true\n", "auth needs a gossip key"},
		// Mutual TLS guards gRPC and the data plane, not gossip.
		{"auth:\n  tokens: [t]\ntls:\n  enabled: true\n  existingSecret: s\n  clientAuth: true\n", "mutual TLS does not protect gossip"},
		{"shm:\n  enabled: true\n", "shm.enabled needs kind: DaemonSet"},
	} {
		f := filepath.Join(t.TempDir(), "values.yaml")
		os.WriteFile(f, []byte(tc.values), 0o644)
		ch, err := loader.Load(chartDir)
		if err != nil {
			t.Fatal(err)
		}
		vals, _ := chartutil.ReadValuesFile(f)
		top, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: "kvmesh", Namespace: "kvmesh"}, chartutil.DefaultCapabilities)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := engine.Render(ch, top); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("values %q: render error %v; want one mentioning %q", tc.values, err, tc.want)
		}
	}
}

// TestChartTLSEverywhere: with TLS on, every listener serves it: the
// node's config sets http-tls, the probes speak HTTPS and Prometheus
// scrapes over HTTPS verified against the cluster CA.
func TestChartTLSEverywhere(t *testing.T) {
	out := render(t, filepath.Join(chartDir, "ci", "daemonset-values.yaml"))
	var (
		cm  corev1.ConfigMap
		ds  appsv1.DaemonSet
		mon serviceMonitor
	)
	for tmpl, text := range out {
		docs := objects(t, tmpl, text)
		if len(docs) == 0 {
			continue
		}
		switch filepath.Base(tmpl) {
		case "configmap.yaml":
			mustDecode(t, docs[0], &cm)
		case "workload.yaml":
			mustDecode(t, docs[0], &ds)
		case "servicemonitor.yaml":
			mustDecode(t, docs[0], &mon)
		}
	}
	if !strings.Contains(cm.Data["kvmesh.yaml"], "http-tls: true") {
		t.Errorf("TLS on, but the node's config does not set http-tls:\n%s", cm.Data["kvmesh.yaml"])
	}
	c := ds.Spec.Template.Spec.Containers[0]
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("%s probe is not HTTPS: %+v", name, p)
		}
	}
	if len(mon.Spec.Endpoints) != 1 || mon.Spec.Endpoints[0].Scheme != "https" || mon.Spec.Endpoints[0].TLSConfig == nil ||
		mon.Spec.Endpoints[0].TLSConfig.CA.Secret.Key != "ca.crt" {
		t.Errorf("ServiceMonitor does not scrape over verified HTTPS: %+v", mon.Spec.Endpoints)
	}
	// TLS off (the defaults): plain HTTP probes, no http-tls.
	for tmpl, text := range render(t, "") {
		if filepath.Base(tmpl) == "configmap.yaml" && strings.Contains(text, "http-tls") {
			t.Errorf("TLS off, yet the config sets http-tls:\n%s", text)
		}
	}
}

func mustDecode(t *testing.T, doc []byte, obj any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		t.Fatal(err)
	}
}

// plainManifests is the chart's default render, for kubectl apply.
func plainManifests(t *testing.T) []byte {
	t.Helper()
	out := render(t, "")
	names := make([]string, 0, len(out))
	for n := range out {
		names = append(names, n)
	}
	sort.Strings(names)
	var b bytes.Buffer
	b.WriteString("# kvmesh: a StatefulSet of 3 nodes, the chart's defaults as plain manifests\n")
	b.WriteString("# (kubectl apply -n kvmesh -f deploy/kubernetes/). Generated from deploy/helm/kvmesh:\n")
	b.WriteString("# edit the chart, then: cd deploy/chartcheck && go test -run TestManifests -update\n")
	for _, n := range names {
		for _, doc := range objects(t, n, out[n]) {
			doc = bytes.ReplaceAll(stripComments(doc), []byte("app.kubernetes.io/managed-by: Helm"), []byte("app.kubernetes.io/managed-by: kubectl"))
			fmt.Fprintf(&b, "---\n# Source: %s\n%s", strings.TrimPrefix(n, "kvmesh/"), bytes.TrimLeft(doc, "-\n"))
		}
	}
	return b.Bytes()
}

// TestManifests validates the plain manifests of deploy/kubernetes, and
// checks that kvmesh.yaml is the chart's default render.
func TestManifests(t *testing.T) {
	want := plainManifests(t)
	if *update {
		if err := os.WriteFile(manifestsFile, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := os.ReadFile(manifestsFile); err != nil || !bytes.Equal(got, want) {
		t.Errorf("%s is not the chart's default render (%v); regenerate it: go test -run TestManifests -update", manifestsFile, err)
	}
	files, err := filepath.Glob("../kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in deploy/kubernetes: %v", err)
	}
	kinds := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range objects(t, f, string(b)) {
			id, err := validate(doc)
			if err != nil {
				t.Errorf("%s: %v", f, err)
				continue
			}
			kinds[strings.SplitN(id, "/", 2)[0]] = true
		}
	}
	for _, want := range []string{"StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget"} {
		if !kinds[want] {
			t.Errorf("deploy/kubernetes has no %s", want)
		}
	}
}

// TestConfigAccepted: kvmesh serve accepts the config file the chart's
// defaults write (the sets with Secrets name files only a pod has).
func TestConfigAccepted(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kvmesh")
	}
	var cm corev1.ConfigMap
	for tmpl, text := range render(t, "") {
		if strings.HasSuffix(tmpl, "configmap.yaml") {
			if err := yaml.UnmarshalStrict(objects(t, tmpl, text)[0], &cm); err != nil {
				t.Fatal(err)
			}
		}
	}
	cfg := filepath.Join(t.TempDir(), "kvmesh.yaml")
	if err := os.WriteFile(cfg, []byte(cm.Data["kvmesh.yaml"]), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "run", "./cmd/kvmesh", "serve", "--config", cfg, "--print-config")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "KVMESH_CONFIG=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kvmesh serve --config <the chart's kvmesh.yaml> --print-config: %v\n%s", err, out)
	}
	for _, want := range []string{`dram: "8GiB"`, `join: ["kvmesh-gossip:7603"]`} {
		if !strings.Contains(strings.Join(strings.Fields(string(out)), " "), want) {
			t.Errorf("--print-config lacks %s:\n%s", want, out)
		}
	}
}
