// Package chartcheck checks the deployment files offline, in CI: the Helm
// chart in deploy/helm/kvmesh renders for each documented set of values
// and passes helm's linter, and every object it renders, and every plain
// manifest in deploy/kubernetes, decodes strictly (unknown fields refused)
// into the Kubernetes API types: the check kubeconform makes against the
// OpenAPI schemas, made against the Go types those schemas come from.
//
// It is a module of its own so that Helm and the Kubernetes libraries stay
// out of kvmesh's go.mod: cd deploy/chartcheck && go test ./...
package chartcheck
