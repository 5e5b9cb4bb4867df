package node

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"sort"

	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// Pagination of the lists that grow with the cluster or the cache: Stats'
// namespaces, Quotas' namespaces and Members. A page follows a cursor, the
// sort key of the last entry of the previous page, so that entries added or
// removed between pages shift nothing. The token is opaque to clients:
// base64url of a version byte, the list's kind (a token of one list is
// refused by another) and the cursor.

const (
	// maxPageSize is the most entries of a page, and the size of a page
	// whose request leaves page_size 0.
	maxPageSize = 1000

	pageTokenVersion = 1
)

// pageKind names the list a token pages through.
type pageKind byte

const (
	pageStats pageKind = iota + 1
	pageQuotas
	pageMembers
)

// pageReq is a validated page request: at most size entries after the
// cursor (from the start when first).
type pageReq struct {
	size   int
	first  bool
	cursor []byte
}

// parsePage validates a request's page_size and page_token for the list
// kind; both errors are InvalidArgument naming the field.
func parsePage(kind pageKind, size int32, token string) (pageReq, error) {
	if size < 0 {
		return pageReq{}, invalid("page_size", "%d is negative; 0 takes the default of %d", size, maxPageSize)
	}
	p := pageReq{size: int(size), first: token == ""}
	if p.size == 0 || p.size > maxPageSize {
		p.size = maxPageSize
	}
	if p.first {
		return p, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(raw) < 2 || raw[0] != pageTokenVersion || pageKind(raw[1]) != kind {
		return pageReq{}, invalidFor(kvmeshv1.ErrorReason_ERROR_REASON_INVALID_PAGE_TOKEN, nil, "page_token",
			"not a next_page_token this node issued for this call; leave it empty for the first page")
	}
	p.cursor = raw[2:]
	return p, nil
}

// pageToken returns the token of the page after cursor.
func pageToken(kind pageKind, cursor []byte) string {
	return base64.RawURLEncoding.EncodeToString(append([]byte{pageTokenVersion, byte(kind)}, cursor...))
}

// digestCursor is the cursor of a list sorted by namespace digest: the
// digest big-endian, so that bytes order as numbers do.
func digestCursor(d uint64) []byte { return binary.BigEndian.AppendUint64(nil, d) }

// pageOf returns at most n entries of sorted (in ascending order of key)
// whose key is greater than cursor, and the token of the next page: empty
// when they are the last.
func pageOf[T any](kind pageKind, sorted []T, key func(T) []byte, cursor []byte, n int) ([]T, string) {
	start := sort.Search(len(sorted), func(i int) bool { return bytes.Compare(key(sorted[i]), cursor) > 0 })
	end := min(len(sorted), start+n)
	out := sorted[start:end]
	switch {
	case end == len(sorted):
		return out, ""
	case len(out) == 0: // n is 0: the next page starts where this one did
		return out, pageToken(kind, cursor)
	}
	return out, pageToken(kind, key(out[len(out)-1]))
}
