// Package router is kvmesh route: the OpenAI-compatible API (package
// openai's wire) in front of a cluster. It imports gossip and openai, never
// node: it is another process, and reaches the nodes over HTTP only.
//
// A Router joins the cluster's gossip as a member that offers no capacity
// (so it owns no block) and learns from the members' metadata where their
// HTTP APIs are and what role each plays. For each completion it asks one
// node how much of the prompt the cluster's cache holds for the caller
// (openai.LookupPath: one Lookup, nothing computed), and sends the request
// to the node with the fewest outstanding uncached prompt tokens: the
// prompt tokens that the requests it sent there and that have not yet
// answered must still compute (PolicyTokens; PolicyRandom and
// PolicySession are the baselines kvmesh bench serve measures it against).
// A session never decides: a cached prefix is a hit on every node, so
// spreading by load costs no hits.
//
// With prefill-role and decode-role members, a request goes first, not
// streamed and with max_tokens 1, to a prefill node (chosen as above),
// which computes the prompt and answers once its blocks are in the cache
// (openai.PublishHeader); then, as the client sent it, to the decode node
// with the fewest outstanding generated tokens, which loads the whole
// prefix from the cache and computes only what is missing. The usage's
// cached_tokens the client sees is then what the prefill node reused,
// rewritten into the decode node's answer (its stream's usage chunk too),
// and both nodes' times are in the response headers.
//
// With engine events (Options.EngineEvents: vLLM-format KV events of the
// engines, and of kvmesh nodes' tiers), the token policy's cost of a
// prompt differs by node: the lookup returns the prompt's block keys too
// (openai.LookupBlocksQuery), and a node is spared the leading blocks its
// engine holds in GPU memory, then the store's cached prefix weighed by
// tier (Weights). An index per member and topic (events.go) holds which
// media hold each block; a subscriber per source applies batches in
// sequence order, asks the source's replay endpoint for what a gap (or the
// time before subscribing) missed, drops what a publisher had published
// when its sequence numbers start over (a restart), and members gone from
// the cluster for EngineEventsTTL lose their entries, as do those of a
// publisher whose connection has been lost that long (a dead engine: its
// member falls back to the store's view).
//
// A batch of the asynchronous API is stored by the node that accepted it,
// and its id names that node (openai.OwnsBatch): the router sends a GET or
// DELETE of it to that node alone (an id of an older node, which names
// none, is asked of the nodes in turn). So a completion costs the nodes
// one lookup and the request itself (split between prefill and decode,
// two), and a queue request one, whatever the cluster's size (issue 35);
// only the list of a caller's batches (GET /v1/queue) asks every node. Answers stream through as they
// come. A node that fails before the first byte of its answer (refused,
// reset, 502/503) is marked down for routerBackoff and the request goes to
// another; once bytes have reached the client, a failure ends the
// response. Bearer tokens and the x-session-affinity header travel through
// unchanged (the session is only logged and counted).
//
// Trust. The nodes' addresses come from gossip, which only the gossip key
// authenticates: a router without Options.GossipKey forwards no request
// that carries credentials (unless InsecureGossip), since any host that
// joined its gossip could be sent them. It routes only to nodes whose TLS
// matches its own (MemberMeta.TLS against Options.NodeTLS), so a node with
// TLS is never sent a client's token in the clear. It forwards the OpenAI
// API's paths only (apiPath: cleaned, checked against a list, a
// percent-encoded slash refused), so no encoding reaches a node's /metrics,
// /debug or /internal, and it passes a node's redirects to the client
// rather than following them.
//
// Files: router.go (Options, New, Serve, the members), balance.go (the
// nodes' loads and the choice), proxy.go (completions and how a request
// is passed on), queue.go (the asynchronous API through the router).
//
// Concurrency. Handlers run on net/http's goroutines and share the nodes'
// loads under one mutex, never held across a request. Serve owns the HTTP
// server and stops it and the gossip when its context ends; Close releases
// a router never served.
package router
