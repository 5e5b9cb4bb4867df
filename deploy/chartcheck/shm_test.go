package chartcheck

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

const workerExample = "../examples/vllm-worker-shm.yaml"

// rendered is one value set's render, decoded: the workload's pod, the
// node's configuration and the Services by name.
type rendered struct {
	pod      corev1.PodSpec
	config   map[string]any
	services map[string]corev1.Service
}

func renderObjects(t *testing.T, valuesFile string) rendered {
	t.Helper()
	r := rendered{services: map[string]corev1.Service{}}
	for tmpl, text := range render(t, valuesFile) {
		for _, doc := range objects(t, tmpl, text) {
			if _, err := validate(doc); err != nil {
				t.Fatalf("%s: %v", tmpl, err)
			}
			var head struct{ Kind string }
			if err := yaml.Unmarshal(doc, &head); err != nil {
				t.Fatal(err)
			}
			switch head.Kind {
			case "StatefulSet", "DaemonSet":
				var w appsv1.DaemonSet
				if err := yaml.Unmarshal(doc, &w); err != nil {
					t.Fatal(err)
				}
				r.pod = w.Spec.Template.Spec
			case "ConfigMap":
				var cm corev1.ConfigMap
				if err := yaml.Unmarshal(doc, &cm); err != nil {
					t.Fatal(err)
				}
				if err := yaml.Unmarshal([]byte(cm.Data["kvmesh.yaml"]), &r.config); err != nil {
					t.Fatal(err)
				}
			case "Service":
				var s corev1.Service
				if err := yaml.Unmarshal(doc, &s); err != nil {
					t.Fatal(err)
				}
				r.services[s.Name] = s
			}
		}
	}
	return r
}

// TestChartSharedMemory: the per-host value set puts the node's socket in
// a directory of its own under the host's data directory, with a group
// (0660) the node's pod belongs to, and a Service that routes workers to
// the node on their own host; the worker example mounts exactly that
// directory, read-only, at the path the node reports, in that group. The
// defaults (a StatefulSet) keep shared memory off, and asking a
// StatefulSet for it fails the render.
func TestChartSharedMemory(t *testing.T) {
	ds := filepath.Join(chartDir, "ci", "daemonset-values.yaml")
	vals, err := chartutil.ReadValuesFile(ds)
	if err != nil {
		t.Fatal(err)
	}
	hostPath := vals["persistence"].(map[string]any)["hostPath"].(string)
	gid := int64(vals["shm"].(map[string]any)["gid"].(float64))
	r := renderObjects(t, ds)
	sock, _ := r.config["shm-socket"].(string)
	if sock != "/var/lib/kvmesh/shm/shm.sock" || r.config["shm-socket-mode"] != "0660" || r.config["shm-socket-group"] != strconv.FormatInt(gid, 10) {
		t.Fatalf("per-host node config: shm-socket %v, mode %v, group %v", r.config["shm-socket"], r.config["shm-socket-mode"], r.config["shm-socket-group"])
	}
	if r.pod.SecurityContext == nil || !slices.Contains(r.pod.SecurityContext.SupplementalGroups, gid) {
		t.Errorf("the node's pod is not in group %d, which it gives the socket to", gid)
	}
	local, ok := r.services["kvmesh-local"]
	if !ok || local.Spec.InternalTrafficPolicy == nil || *local.Spec.InternalTrafficPolicy != corev1.ServiceInternalTrafficPolicyLocal {
		t.Errorf("no Service kvmesh-local routing to the node on the caller's host: %+v", local.Spec)
	}

	b, err := os.ReadFile(workerExample)
	if err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := yaml.UnmarshalStrict(b, &pod); err != nil {
		t.Fatalf("%s: %v", workerExample, err)
	}
	if pod.Spec.SecurityContext == nil || !slices.Contains(pod.Spec.SecurityContext.SupplementalGroups, gid) {
		t.Errorf("the worker example is not in group %d", gid)
	}
	var mounted bool
	for _, c := range pod.Spec.Containers {
		for _, m := range c.VolumeMounts {
			for _, v := range pod.Spec.Volumes {
				if v.Name != m.Name || v.HostPath == nil {
					continue
				}
				mounted = v.HostPath.Path == filepath.Join(hostPath, "shm") && m.MountPath == filepath.Dir(sock) && m.ReadOnly
				if !mounted {
					t.Errorf("the worker example mounts %s at %s (read-only %v); want %s/shm read-only at %s",
						v.HostPath.Path, m.MountPath, m.ReadOnly, hostPath, filepath.Dir(sock))
				}
			}
		}
		for _, e := range c.Env {
			if e.Name == "KVMESH_ADDR" && e.Value != "kvmesh-local.kvmesh.svc:7600" {
				t.Errorf("the worker example dials %s, not the Service of its host's node", e.Value)
			}
		}
	}
	if !mounted {
		t.Error("the worker example mounts no host directory for the node's socket")
	}

	if def := renderObjects(t, ""); def.config["shm-socket"] != "off" {
		t.Errorf("defaults (StatefulSet): shm-socket %v, want off", def.config["shm-socket"])
	}
}
