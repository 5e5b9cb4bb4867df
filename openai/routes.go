package openai

import (
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/kvmesh/kvmesh/auth"
)

// handler answers one route of the API for an authorized caller; an error
// is answered as OpenAI's error object (an *httpError says which).
type handler func(w http.ResponseWriter, r *http.Request, who auth.Principal) error

// Register mounts the API on mux, one http.ServeMux pattern per route:
// the completions, the models, the lookup, the asynchronous API and the
// owner's side of work stealing. A known path asked with another method
// is 405 and any other path under /v1/ 404, both as OpenAI's error object.
func (o *API) Register(mux *http.ServeMux) {
	route := func(pattern, label string, h handler) { mux.Handle(pattern, o.handle(label, h)) }
	route("GET /v1/models", "/v1/models", o.models)
	route("GET /v1/models/{id...}", "/v1/models/{id}", o.modelByID)
	route("POST /v1/completions", "/v1/completions", o.completion(false))
	route("POST /v1/chat/completions", "/v1/chat/completions", o.completion(true))
	route("POST "+LookupPath+"/completions", LookupPath, o.lookupOf(false))
	route("POST "+LookupPath+"/chat/completions", LookupPath, o.lookupOf(true))
	route("POST "+QueuePath, QueuePath, o.submit)
	route("GET "+QueuePath, QueuePath, o.list)
	route("GET "+QueuePath+"/callback-key", QueuePath+"/{id}", o.callbackKey)
	route("GET "+QueuePath+"/{id...}", QueuePath+"/{id}", o.status)
	route("DELETE "+QueuePath+"/{id...}", QueuePath+"/{id}", o.cancelBatch)
	for _, m := range []struct{ path, label, allow, use string }{
		{"/v1/models", "/v1/models", "GET", "GET"},
		{"/v1/models/{id...}", "/v1/models/{id}", "GET", "GET"},
		{"/v1/completions", "/v1/completions", "POST", "POST"},
		{"/v1/chat/completions", "/v1/chat/completions", "POST", "POST"},
		{LookupPath + "/completions", LookupPath, "POST", "POST"},
		{LookupPath + "/chat/completions", LookupPath, "POST", "POST"},
		{QueuePath, QueuePath, "GET, POST", "POST (or GET for the list)"},
		{QueuePath + "/{id...}", QueuePath + "/{id}", "GET, DELETE", "GET or DELETE"},
	} {
		route(m.path, m.label, methodNotAllowed(m.allow, m.use))
	}
	route(LookupPath+"/", LookupPath, notFound)
	route("/v1/", "other", notFound)
	// Outside /v1/ (a client whose base URL lacks /v1): no credentials
	// asked, OpenAI's 404 all the same.
	mux.HandleFunc("/", NotFound)

	mux.Handle("POST "+internalQueuePath+"claim", o.internal(controlClaim, o.lend))
	mux.Handle("POST "+internalQueuePath+"{id}/answer", o.internal(controlLease, o.answerLeased))
	mux.Handle("POST "+internalQueuePath+"{id}/renew", o.internal(controlLease, o.renewLease))
	mux.Handle("POST "+internalQueuePath+"{id}/release", o.internal(controlLease, o.releaseLease))
	mux.Handle("POST "+internalQueuePath, o.internal(controlLease, func(_ http.ResponseWriter, r *http.Request, _ leaseCall) error {
		return newHTTPError(http.StatusNotFound, "", "not_found", "no such internal queue call %q", strings.TrimPrefix(r.URL.Path, internalQueuePath))
	}))
}

// RegisterDisabled mounts on mux what a node without an engine answers in
// the API's place: 503.
func RegisterDisabled(mux *http.ServeMux) {
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, _ *http.Request) {
		WriteError(w, http.StatusServiceUnavailable, "this node runs no engine (Prefill.Disabled)", "server_error", "", "engine_disabled")
	})
	mux.HandleFunc("/", NotFound)
	mux.HandleFunc("POST "+internalQueuePath, func(w http.ResponseWriter, _ *http.Request) {
		WriteError(w, http.StatusServiceUnavailable, "this node runs no queue", "server_error", "", "")
	})
}

// handle wraps a route's handler: a stopping node refuses it, the caller
// must hold the scope the request needs (need), an error is answered as
// OpenAI's error object, and the answer is counted under label.
func (o *API) handle(label string, h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case label == LookupPath:
			o.batchMetrics.control.WithLabelValues(controlLookup).Inc()
		case label == QueuePath+"/{id}" && r.Header.Get(ForwardedHeader) != "":
			o.batchMetrics.control.WithLabelValues(controlQueueForwarded).Inc()
		}
		sw := &statusWriter{ResponseWriter: w}
		err := o.authorized(sw, r, h)
		if err != nil {
			o.answerError(sw, r, err)
		}
		code := sw.code
		if code == 0 {
			code = 499 // the client left before any answer
		}
		o.metrics.requests.WithLabelValues(label, strconv.Itoa(code)).Inc()
	})
}

func (o *API) authorized(w http.ResponseWriter, r *http.Request, h handler) error {
	if o.n.Stopping() {
		return newHTTPError(http.StatusServiceUnavailable, "", "", "the node is shutting down; retry on another node")
	}
	who, err := o.authorize(r, r.Method+" "+r.URL.Path, need(r))
	if err != nil {
		return err
	}
	return h(w, r, who)
}

// need is the scope a request needs: writes (they publish the blocks they
// compute, store or cancel batches) but for the lookup, which reads.
func need(r *http.Request) auth.Scope {
	if (r.Method == http.MethodPost || r.Method == http.MethodDelete) && !strings.HasPrefix(r.URL.Path, LookupPath+"/") {
		return auth.Write
	}
	return auth.Read
}

// answerError answers err as OpenAI's error object, unless a stream already
// started (its handler sent the error in it), and logs it.
func (o *API) answerError(w *statusWriter, r *http.Request, err error) {
	var he *httpError
	if !errors.As(err, &he) {
		he = newHTTPError(http.StatusInternalServerError, "", "", "%v", err)
		o.log.Error("openai: request failed", "path", clip(r.URL.Path), "err", err)
	}
	if w.code == 0 {
		if he.retryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(he.retryAfter))
		}
		WriteJSON(w, he.status, struct {
			Error apiError `json:"error"`
		}{he.apiError})
	}
	if he.status != http.StatusInternalServerError {
		o.log.Info("openai: request refused", "path", clip(r.URL.Path), "status", he.status, "err", he.Message)
	}
}

// methodNotAllowed answers a known path asked with a method it does not
// serve (allow: the Allow header's methods; use: what the message says).
func methodNotAllowed(allow, use string) handler {
	return func(w http.ResponseWriter, r *http.Request, _ auth.Principal) error {
		w.Header().Set("Allow", allow)
		return newHTTPError(http.StatusMethodNotAllowed, "", "method_not_allowed", "%s %s: use %s", r.Method, r.URL.Path, use)
	}
}

func notFound(_ http.ResponseWriter, r *http.Request, _ auth.Principal) error {
	return unknownURL(r)
}

// NotFound answers a path no route serves with OpenAI's 404 error object,
// saying where the API is when the path is outside /v1/ (an SDK whose base
// URL lacks /v1). The router answers its unknown paths with it too.
func NotFound(w http.ResponseWriter, r *http.Request) {
	he := unknownURL(r)
	WriteJSON(w, he.status, struct {
		Error apiError `json:"error"`
	}{he.apiError})
}

func unknownURL(r *http.Request) *httpError {
	if !strings.HasPrefix(r.URL.Path, "/v1/") {
		return newHTTPError(http.StatusNotFound, "", "unknown_url", "no such path: %s %s; the OpenAI API is under /v1/: set the client's base URL to http://%s/v1", r.Method, r.URL.Path, r.Host)
	}
	return newHTTPError(http.StatusNotFound, "", "unknown_url", "no such path: %s %s (this node serves /v1/models, /v1/completions, /v1/chat/completions and /v1/queue)", r.Method, r.URL.Path)
}

// models answers GET /v1/models: the engine's model.
func (o *API) models(w http.ResponseWriter, _ *http.Request, _ auth.Principal) error {
	WriteJSON(w, http.StatusOK, struct {
		Object string      `json:"object"`
		Data   []modelJSON `json:"data"`
	}{"list", []modelJSON{o.modelJSON()}})
	return nil
}

// modelByID answers GET /v1/models/{id}.
func (o *API) modelByID(w http.ResponseWriter, r *http.Request, _ auth.Principal) error {
	if id := r.PathValue("id"); !o.knows(id) {
		return o.unknownModel(id)
	}
	WriteJSON(w, http.StatusOK, o.modelJSON())
	return nil
}

// completion answers POST /v1/completions, or /v1/chat/completions (chat).
func (o *API) completion(chat bool) handler {
	return func(w http.ResponseWriter, r *http.Request, who auth.Principal) error {
		return o.complete(w, r, chat, who)
	}
}

// lookupOf answers POST LookupPath/completions, or /chat/completions (chat).
func (o *API) lookupOf(chat bool) handler {
	return func(w http.ResponseWriter, r *http.Request, who auth.Principal) error {
		return o.lookup(w, r, chat, who)
	}
}

func (o *API) modelJSON() modelJSON {
	return modelJSON{ID: o.model, Object: "model", OwnedBy: "kvmesh"}
}

func (o *API) knows(model string) bool { return model == o.model || model == ModelAlias }

func (o *API) unknownModel(model string) error {
	return newHTTPError(http.StatusNotFound, "model", "model_not_found", "the model %q does not exist on this node; it serves %q (also called %q)", model, o.model, ModelAlias)
}
