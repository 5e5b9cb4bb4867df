package chartcheck

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

const releaseScript = "../release.sh"

// releasePlan runs deploy/release.sh --dry-run with args and returns the
// commands it would run, each split into its words.
func releasePlan(t *testing.T, args ...string) [][]string {
	t.Helper()
	cmd := exec.Command("bash", append([]string{releaseScript, "--dry-run"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("release.sh --dry-run %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var plan [][]string
	for line := range strings.Lines(string(out)) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "+ "); ok {
			plan = append(plan, shellWords(rest))
		}
	}
	return plan
}

// shellWords splits a command as bash's printf %q wrote it: words apart
// at unescaped spaces, a backslash escaping the next character.
func shellWords(s string) []string {
	var words []string
	var w strings.Builder
	in := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && i+1 < len(s):
			i++
			w.WriteByte(s[i])
			in = true
		case c == ' ':
			if in {
				words = append(words, w.String())
				w.Reset()
				in = false
			}
		default:
			w.WriteByte(c)
			in = true
		}
	}
	if in {
		words = append(words, w.String())
	}
	return words
}

// flagValue returns the word after flag in cmd, or "".
func flagValue(cmd []string, flag string) string {
	if i := slices.Index(cmd, flag); i >= 0 && i+1 < len(cmd) {
		return cmd[i+1]
	}
	return ""
}

// TestReleasePlan checks what deploy/release.sh runs (docker is not
// available to CI): a static build of kvmesh for linux/amd64 and
// linux/arm64 with the version and revision stamped as the Dockerfile
// stamps them, the chart packaged with that version and image, and one
// multi-platform image build tagged with the chart's default image.
func TestReleasePlan(t *testing.T) {
	dockerfile, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args           []string
		version, image string
		push           bool
	}{
		{nil, readVersion(t), "kvmesh", false},
		{[]string{"--version", "1.2.3-rc.1", "--image", "registry.example.com/ml/kvmesh", "--push"}, "1.2.3-rc.1", "registry.example.com/ml/kvmesh", true},
	} {
		plan := releasePlan(t, tc.args...)
		var arches []string
		var pack, image []string
		for _, cmd := range plan {
			switch {
			case slices.Contains(cmd, "build") && slices.Contains(cmd, "go"):
				env := strings.Join(cmd[:slices.Index(cmd, "go")], " ")
				if !strings.Contains(env, "CGO_ENABLED=0") || !strings.Contains(env, "GOOS=linux") || !slices.Contains(cmd, "-trimpath") {
					t.Errorf("go build not static, for linux and -trimpath: %q", cmd)
				}
				for _, a := range []string{"amd64", "arm64"} {
					if strings.Contains(env, "GOARCH="+a) {
						arches = append(arches, a)
						if out := flagValue(cmd, "-o"); !strings.HasSuffix(out, "kvmesh-"+tc.version+"-linux-"+a) {
							t.Errorf("go build -o %s; want the binary named for %s and %s", out, tc.version, a)
						}
					}
				}
				ld := flagValue(cmd, "-ldflags")
				if !strings.Contains(ld, "-X main.releaseVersion="+tc.version+" ") || !strings.Contains(ld, "-X github.com/kvmesh/kvmesh/node.revision=") {
					t.Errorf("go build -ldflags %q stamps no version %s and revision", ld, tc.version)
				}
				// The Dockerfile's build stamps the same variables.
				for _, v := range []string{"-X main.releaseVersion=${VERSION}", "-X github.com/kvmesh/kvmesh/node.revision=${REVISION}", "-trimpath", "-buildvcs=false"} {
					if !bytes.Contains(dockerfile, []byte(v)) {
						t.Errorf("the Dockerfile's build lacks %s, which release.sh's binaries have", v)
					}
				}
			case slices.Contains(cmd, "./cmd/chartpack"):
				pack = cmd
			case slices.Contains(cmd, "docker"):
				image = cmd
			}
		}
		if !slices.Equal(arches, []string{"amd64", "arm64"}) {
			t.Errorf("release.sh %v builds for %v; want amd64 and arm64", tc.args, arches)
		}
		if flagValue(pack, "-version") != tc.version || flagValue(pack, "-image") != tc.image {
			t.Errorf("chart packaged with %q; want version %s and image %s", pack, tc.version, tc.image)
		}
		if flagValue(image, "--platform") != "linux/amd64,linux/arm64" || flagValue(image, "-t") != tc.image+":"+tc.version ||
			!slices.Contains(image, "VERSION="+tc.version) || slices.Contains(image, "--push") != tc.push {
			t.Errorf("release.sh %v builds the image with %q; want %s:%s for both platforms, push %v", tc.args, image, tc.image, tc.version, tc.push)
		}
	}
	if plan := releasePlan(t, "--no-image"); slices.ContainsFunc(plan, func(c []string) bool { return slices.Contains(c, "docker") }) {
		t.Errorf("release.sh --no-image still runs docker: %q", plan)
	}
	if err := exec.Command("bash", releaseScript, "--dry-run", "--version", "latest").Run(); err == nil {
		t.Error("release.sh --version latest ran; Helm needs a semantic version")
	}
}

func readVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestChartDefaultImage: the chart in the tree defaults to the image a
// release build of the VERSION file tags (kvmesh:VERSION), and a packaged
// chart to the image that build was given; packaging the same tree twice
// gives the same bytes.
func TestChartDefaultImage(t *testing.T) {
	version := readVersion(t)
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	if ch.Metadata.AppVersion != version {
		t.Errorf("Chart.yaml appVersion %s; the VERSION file says %s", ch.Metadata.AppVersion, version)
	}
	if got := containerImage(t, ch); got != "kvmesh:"+version {
		t.Errorf("the chart's default image is %s; release.sh tags kvmesh:%s", got, version)
	}

	mtime := time.Unix(1700000000, 0)
	var archives [][]byte
	for range 2 {
		path, err := Package(chartDir, "2.0.1", "registry.example.com/kvmesh", mtime, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(path) != "kvmesh-2.0.1.tgz" {
			t.Errorf("packaged as %s", path)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		archives = append(archives, b)
		packed, err := loader.LoadArchive(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		if packed.Metadata.Version != "2.0.1" || packed.Metadata.AppVersion != "2.0.1" {
			t.Errorf("packaged chart: version %s, appVersion %s", packed.Metadata.Version, packed.Metadata.AppVersion)
		}
		if got := containerImage(t, packed); got != "registry.example.com/kvmesh:2.0.1" {
			t.Errorf("the packaged chart's default image is %s; want registry.example.com/kvmesh:2.0.1", got)
		}
	}
	if !bytes.Equal(archives[0], archives[1]) {
		t.Error("the same chart packaged twice differs")
	}
}

// containerImage renders ch with its defaults and returns its kvmesh
// container's image.
func containerImage(t *testing.T, ch *chart.Chart) string {
	t.Helper()
	top, err := chartutil.ToRenderValues(ch, map[string]any{}, chartutil.ReleaseOptions{Name: "kvmesh", Namespace: "kvmesh", IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	out, err := engine.Render(ch, top)
	if err != nil {
		t.Fatal(err)
	}
	for name, text := range out {
		if !strings.HasSuffix(name, "workload.yaml") {
			continue
		}
		for _, doc := range objects(t, name, text) {
			var ss appsv1.StatefulSet
			if err := yaml.Unmarshal(doc, &ss); err != nil {
				t.Fatal(err)
			}
			for _, c := range ss.Spec.Template.Spec.Containers {
				if c.Name == "kvmesh" {
					return c.Image
				}
			}
		}
	}
	t.Fatal("no kvmesh container rendered")
	return ""
}
