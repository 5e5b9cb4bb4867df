package chartcheck

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
)

// imageRepository is values.yaml's image.repository line: the first
// indented "repository:" after the top-level "image:".
var imageRepository = regexp.MustCompile(`(?m)(^image:\n(?:[ \t]+.*\n|[ \t]*#.*\n)*?[ \t]+repository:[ \t]*)(\S+)`)

// Package writes the chart in chartDir into outDir as NAME-VERSION.tgz, as
// helm package --version version --app-version version would, with
// image.repository in its values.yaml set to image, so that the packaged
// chart's default image is image:version, the one a release build makes.
// Every entry of the archive carries mtime, and the gzip header no time,
// so the same tree packages to the same bytes. It returns the archive's
// path.
func Package(chartDir, version, image string, mtime time.Time, outDir string) (string, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return "", fmt.Errorf("chartpack: %w", err)
	}
	ch.Metadata.Version, ch.Metadata.AppVersion = version, version
	found := false
	for _, f := range ch.Raw {
		if f.Name != chartutil.ValuesfileName {
			continue
		}
		if !imageRepository.Match(f.Data) {
			return "", fmt.Errorf("chartpack: %s has no image.repository line", f.Name)
		}
		f.Data = imageRepository.ReplaceAll(f.Data, []byte("${1}"+image))
		found = true
	}
	if !found {
		return "", fmt.Errorf("chartpack: %s has no %s", chartDir, chartutil.ValuesfileName)
	}
	tmp, err := os.MkdirTemp("", "chartpack-")
	if err != nil {
		return "", fmt.Errorf("chartpack: %w", err)
	}
	defer os.RemoveAll(tmp)
	saved, err := chartutil.Save(ch, tmp)
	if err != nil {
		return "", fmt.Errorf("chartpack: %w", err)
	}
	b, err := normalize(saved, mtime)
	if err != nil {
		return "", fmt.Errorf("chartpack: %s: %w", saved, err)
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return "", fmt.Errorf("chartpack: %w", err)
	}
	path := filepath.Join(outDir, filepath.Base(saved))
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return "", fmt.Errorf("chartpack: %w", err)
	}
	return path, nil
}

// normalize rewrites a chart archive with every entry's time set to mtime
// and a gzip header without a time: Helm stamps the clock's time.
func normalize(path string, mtime time.Time) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	zw.Header.Comment = zr.Header.Comment
	zw.Header.Extra = zr.Header.Extra
	tr, tw := tar.NewReader(zr), tar.NewWriter(zw)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		h.ModTime, h.AccessTime, h.ChangeTime = mtime.UTC(), time.Time{}, time.Time{}
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}
