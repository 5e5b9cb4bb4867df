package router

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"

	"github.com/kvmesh/kvmesh/openai"
)

// submitQueue passes POST /v1/queue to any node: it stores the batch and
// runs it, and its id is found later by asking the nodes.
func (r *Router) submitQueue(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, openai.DefaultBatchMaxBodyBytes))
	if err != nil {
		openai.WriteError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is too large (at most %d bytes) or unreadable", openai.DefaultBatchMaxBodyBytes), "invalid_request_error", "", "request_too_large")
		return
	}
	r.forwardAny(w, req, body)
}

// listQueue answers GET /v1/queue with every node's list of the caller's
// batches; a node's error (a refused token) is answered as is.
func (r *Router) listQueue(w http.ResponseWriter, req *http.Request) {
	all := openai.QueueList{Object: "list", Data: []openai.QueueBatch{}}
	answered := false
	for _, b := range r.backends() {
		rec := &captureWriter{header: http.Header{}}
		if _, err := r.try(rec, req, nil, req.URL.Path, b, func() {}, nil); err != nil {
			continue
		}
		if rec.code != http.StatusOK {
			copyHeader(w.Header(), rec.header)
			w.WriteHeader(rec.code)
			w.Write(rec.body.Bytes())
			return
		}
		var l openai.QueueList
		if json.Unmarshal(rec.body.Bytes(), &l) == nil {
			all.Data = append(all.Data, l.Data...)
			answered = true
		}
	}
	if !answered {
		openai.WriteError(w, http.StatusServiceUnavailable, "no node serves the API: none has joined, or all are down", "server_error", "", "no_backend")
		return
	}
	openai.WriteJSON(w, http.StatusOK, all)
}

// forwardQueue passes GET or DELETE /v1/queue/{id} to the node that holds
// the batch: the node the id names (openai.OwnsBatch), marked down or not,
// alone; for an id that names none (an older node's), every node in turn,
// answering with the first answer that is not 404 (404 when every node
// says so). A batch is stored by the node that accepted it, and only its
// id says which (issue 35: asking the nodes in turn cost a request N/2
// calls on average).
func (r *Router) forwardQueue(w http.ResponseWriter, req *http.Request) {
	id := req.PathValue("id")
	req = req.Clone(req.Context())
	req.Header.Set(openai.ForwardedHeader, "1") // the router asks the nodes: they need not ask their peers
	cands := r.backends()
	_, named := openai.OwnsBatch("", id)
	if named {
		cands = slices.DeleteFunc(r.serving(false), func(b backend) bool {
			owns, _ := openai.OwnsBatch(b.id, id)
			return !owns
		})
		if len(cands) == 0 {
			openai.WriteError(w, http.StatusNotFound, fmt.Sprintf("no queued batch %q: the node that accepted it is not in the cluster now", id),
				"invalid_request_error", "request_id", "not_found")
			return
		}
	}
	var last *captureWriter
	for _, b := range cands {
		rec := &captureWriter{header: http.Header{}}
		if _, err := r.try(rec, req, nil, req.URL.Path, b, func() {}, nil); err != nil {
			continue // down or stopping: another node may hold it, else 404 below
		}
		last = rec
		if rec.code != http.StatusNotFound {
			break
		}
	}
	switch {
	case last == nil && named:
		w.Header().Set("Retry-After", "1")
		openai.WriteError(w, http.StatusServiceUnavailable, fmt.Sprintf("the node that holds the batch %q did not answer; retry", id), "server_error", "request_id", "")
		return
	case last == nil:
		openai.WriteError(w, http.StatusServiceUnavailable, "no node serves the API: none has joined, or all are down", "server_error", "", "no_backend")
		return
	}
	copyHeader(w.Header(), last.header)
	w.WriteHeader(last.code)
	w.Write(last.body.Bytes())
}
