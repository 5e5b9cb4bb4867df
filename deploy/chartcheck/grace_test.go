package chartcheck

import (
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// TestChartGracePeriod: for every documented set of values, the pod's
// termination grace period covers a graceful stop: the preStop hook, then
// three steps of shutdown-timeout (requests finishing, the handoff and
// leave, DRAM written to NVMe) and a margin for closing.
func TestChartGracePeriod(t *testing.T) {
	const margin = 10 * time.Second
	for name, file := range valueSets(t) {
		t.Run(name, func(t *testing.T) {
			var pod *corev1.PodSpec
			shutdown := 8 * time.Second // kvmesh serve's default
			for tmpl, text := range render(t, file) {
				for _, doc := range objects(t, tmpl, text) {
					var head struct{ Kind string }
					if err := yaml.Unmarshal(doc, &head); err != nil {
						t.Fatal(err)
					}
					switch head.Kind {
					case "StatefulSet", "DaemonSet":
						var w appsv1.StatefulSet // the pod template is at the same place in both
						if err := yaml.Unmarshal(doc, &w); err != nil {
							t.Fatal(err)
						}
						pod = &w.Spec.Template.Spec
					case "ConfigMap":
						var cm corev1.ConfigMap
						if err := yaml.Unmarshal(doc, &cm); err != nil {
							t.Fatal(err)
						}
						var cfg map[string]any
						if err := yaml.Unmarshal([]byte(cm.Data["kvmesh.yaml"]), &cfg); err != nil {
							t.Fatal(err)
						}
						if v, ok := cfg["shutdown-timeout"].(string); ok {
							d, err := time.ParseDuration(v)
							if err != nil {
								t.Fatalf("shutdown-timeout %q: %v", v, err)
							}
							shutdown = d
						}
					}
				}
			}
			if pod == nil || pod.TerminationGracePeriodSeconds == nil {
				t.Fatal("no pod template with a termination grace period")
			}
			var preStop time.Duration
			for _, c := range pod.Containers {
				if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
					preStop = preStopTime(t, c.Lifecycle.PreStop)
				}
			}
			grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
			if need := preStop + 3*shutdown + margin; grace < need {
				t.Errorf("terminationGracePeriodSeconds %v; a graceful stop takes up to %v (preStop %v, 3 × shutdown-timeout %v, %v to close)",
					grace, need, preStop, shutdown, margin)
			}
		})
	}
}

// preStopTime is how long a preStop hook waits.
func preStopTime(t *testing.T, h *corev1.LifecycleHandler) time.Duration {
	t.Helper()
	switch {
	case h.Sleep != nil:
		return time.Duration(h.Sleep.Seconds) * time.Second
	case h.Exec != nil:
		// ["kvmesh", "sleep", "5s"] or a shell's sleep N
		last := h.Exec.Command[len(h.Exec.Command)-1]
		if d, err := time.ParseDuration(last); err == nil {
			return d
		}
		if d, err := time.ParseDuration(strings.TrimSpace(last) + "s"); err == nil {
			return d
		}
	}
	t.Fatalf("a preStop hook whose wait the test cannot read: %+v", h)
	return 0
}

// TestChartKubeVersion: the preStop hook sleeps with the kubelet's sleep
// action (the image has no shell), on by default from Kubernetes 1.30, so
// the chart declares that minimum: helm install refuses an older cluster
// instead of pods that never start.
func TestChartKubeVersion(t *testing.T) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	kv := ch.Metadata.KubeVersion
	for v, want := range map[string]bool{"v1.29.9": false, "v1.30.0": true, "v1.33.1": true} {
		if got := kv != "" && chartutil.IsCompatibleRange(kv, v); got != want {
			t.Errorf("Chart.yaml kubeVersion %q admits Kubernetes %s: %v, want %v", kv, v, got, want)
		}
	}
}
