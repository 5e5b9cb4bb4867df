// Package auth says who a caller is and what it may touch: principals
// (a tenant and scopes), the tokens file that maps bearer tokens to them,
// the namespace salt and block tag a tenant's data carries, and the access
// a single request is granted.
//
// # The trust model
//
// A node runs in one of three modes, chosen by its configuration:
//
//   - Open: no token. Every caller is Open: it may read, write and
//     administer everything. For a node on a trusted host or network only.
//   - Shared token (single-tenant): every accepted token is a full
//     principal (read, write, admin, cluster) with no tenant. For
//     deployments with one tenant; tenants that need to be kept apart need
//     the tokens file.
//   - Tokens file (multi-tenant): each token names a tenant and scopes.
//     A tenant-scoped caller's namespaces are salted by the node with a salt
//     derived from the tenant and the file's secret (Principal.Salt), so
//     it can neither name nor compute another tenant's namespaces or keys;
//     its blocks carry its tag (TagOf) in their header, and every path
//     that serves, stores or describes a block checks the tag against the
//     request's Access. Node-to-node traffic uses a credential with the
//     cluster scope, which tenants never hold.
//
// Scopes: Read (lookups, gets, stats of its own namespaces), Write (puts,
// publishes, prefill that publishes), Admin (quotas and drops of its own
// namespaces; a node-wide admin, one with no tenant, of every namespace)
// and Cluster (the peer service and unscoped data-plane requests on behalf
// of any tenant).
//
// # Concurrency
//
// Principal and Access are values. Everything here is safe for concurrent
// use.
package auth
