//go:build !purego

#include "textflag.h"

// The AVX2+FMA kernels of kernels_amd64.go. Each element of C is the sum
// of 8 lanes, lane l accumulating a[p]·b[p] for p ≡ l (mod 8) in order of p
// by FMA (the last, partial 8 read through a mask, the lanes past k zero),
// then summed as ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)), scaled by alpha,
// plus beta·c by FMA unless beta is 0: the same in both kernels.

// masks: 8 words of ones, then 8 of zeros. The 8 words at masks+4·(8−t)
// select the first t lanes.
DATA masks<>+0(SB)/8, $0xffffffffffffffff
DATA masks<>+8(SB)/8, $0xffffffffffffffff
DATA masks<>+16(SB)/8, $0xffffffffffffffff
DATA masks<>+24(SB)/8, $0xffffffffffffffff
DATA masks<>+32(SB)/8, $0
DATA masks<>+40(SB)/8, $0
DATA masks<>+48(SB)/8, $0
DATA masks<>+56(SB)/8, $0
GLOBL masks<>(SB), RODATA|NOPTR, $64

// BROWS points BX, CX, DX, SI at the 4 rows of B, rows past nr at the
// last one of them (their sums are computed and not stored).
#define BROWS \
	MOVQ b+24(FP), BX; \
	MOVQ ldb+32(FP), R9; \
	SHLQ $2, R9; \
	MOVQ nr+40(FP), R10; \
	MOVQ BX, CX; \
	CMPQ R10, $2; \
	JLT  2(PC); \
	ADDQ R9, CX; \
	MOVQ CX, DX; \
	CMPQ R10, $3; \
	JLT  2(PC); \
	ADDQ R9, DX; \
	MOVQ DX, SI; \
	CMPQ R10, $4; \
	JLT  2(PC); \
	ADDQ R9, SI

// KSPLIT sets R13 to the bytes of k's whole 8s, R14 to k mod 8, DI to 0.
#define KSPLIT \
	MOVQ k+0(FP), R13; \
	MOVQ R13, R14; \
	ANDQ $7, R14; \
	ANDQ $-8, R13; \
	SHLQ $2, R13; \
	XORQ DI, DI

// TAILMASK loads the mask of R14 lanes into Y15 (R10 := its address).
#define TAILMASK \
	MOVQ $8, R10; \
	SUBQ R14, R10; \
	LEAQ masks<>(SB), R14; \
	LEAQ (R14)(R10*4), R10; \
	VMOVUPS (R10), Y15

// REDUCE sums the lanes of y0..y3 (destroying them) into the 4 lanes of
// x0, the xmm half of y0.
#define REDUCE(y0, y1, y2, y3, x0) \
	VHADDPS y1, y0, y0; \
	VHADDPS y3, y2, y2; \
	VHADDPS y2, y0, y0; \
	VEXTRACTF128 $1, y0, X15; \
	VADDPS X15, x0, x0

// EPILOGUE sets X12 to alpha, X13 to beta, X14 to the mask of nr lanes,
// R10 to c, R9 to ldc in bytes and R13 to beta's bits less the sign.
#define EPILOGUE \
	VBROADCASTSS alpha+64(FP), X12; \
	VBROADCASTSS beta+68(FP), X13; \
	MOVQ nr+40(FP), R10; \
	MOVQ $8, R9; \
	SUBQ R10, R9; \
	LEAQ masks<>(SB), R10; \
	VMOVUPS (R10)(R9*4), X14; \
	MOVQ c+48(FP), R10; \
	MOVQ ldc+56(FP), R9; \
	SHLQ $2, R9; \
	MOVL beta+68(FP), R13; \
	ANDL $0x7fffffff, R13

// STORE0 writes alpha·x to the nr columns at (R10); STORE adds beta·c.
#define STORE0(x) \
	VMULPS X12, x, x; \
	VMASKMOVPS x, X14, (R10)

#define STORE(x) \
	VMULPS X12, x, x; \
	VMASKMOVPS (R10), X14, X15; \
	VFMADD231PS X15, X13, x; \
	VMASKMOVPS x, X14, (R10)

// ZERO12 zeroes Y0..Y11.
#define ZERO12 \
	VXORPS Y0, Y0, Y0; \
	VXORPS Y1, Y1, Y1; \
	VXORPS Y2, Y2, Y2; \
	VXORPS Y3, Y3, Y3; \
	VXORPS Y4, Y4, Y4; \
	VXORPS Y5, Y5, Y5; \
	VXORPS Y6, Y6, Y6; \
	VXORPS Y7, Y7, Y7; \
	VXORPS Y8, Y8, Y8; \
	VXORPS Y9, Y9, Y9; \
	VXORPS Y10, Y10, Y10; \
	VXORPS Y11, Y11, Y11

// FMA3 multiplies B's row at (r)(DI*1), in Y15, by the 3 rows of A in
// Y12..Y14 into s0..s2.
#define FMA3(r, s0, s1, s2) \
	VMOVUPS (r)(DI*1), Y15; \
	VFMADD231PS Y15, Y12, s0; \
	VFMADD231PS Y15, Y13, s1; \
	VFMADD231PS Y15, Y14, s2

// FMA3TAIL is FMA3 of the lanes R10's mask selects.
#define FMA3TAIL(r, s0, s1, s2) \
	VMOVUPS (R10), Y15; \
	VMASKMOVPS (r)(DI*1), Y15, Y15; \
	VFMADD231PS Y15, Y12, s0; \
	VFMADD231PS Y15, Y13, s1; \
	VFMADD231PS Y15, Y14, s2

// func dot3x4(k int, a *float32, lda int, b *float32, ldb int, nr int, c *float32, ldc int, alpha float32, beta float32)
TEXT ·dot3x4(SB), NOSPLIT, $0-72
	MOVQ a+8(FP), AX
	MOVQ lda+16(FP), R8
	SHLQ $2, R8
	LEAQ (AX)(R8*1), R11
	LEAQ (AX)(R8*2), R12
	BROWS
	ZERO12
	KSPLIT
	CMPQ DI, R13
	JGE  tail

loop:
	VMOVUPS (AX)(DI*1), Y12
	VMOVUPS (R11)(DI*1), Y13
	VMOVUPS (R12)(DI*1), Y14
	FMA3(BX, Y0, Y4, Y8)
	FMA3(CX, Y1, Y5, Y9)
	FMA3(DX, Y2, Y6, Y10)
	FMA3(SI, Y3, Y7, Y11)
	ADDQ $32, DI
	CMPQ DI, R13
	JLT  loop

tail:
	TESTQ R14, R14
	JZ    reduce
	TAILMASK
	VMASKMOVPS (AX)(DI*1), Y15, Y12
	VMASKMOVPS (R11)(DI*1), Y15, Y13
	VMASKMOVPS (R12)(DI*1), Y15, Y14
	FMA3TAIL(BX, Y0, Y4, Y8)
	FMA3TAIL(CX, Y1, Y5, Y9)
	FMA3TAIL(DX, Y2, Y6, Y10)
	FMA3TAIL(SI, Y3, Y7, Y11)

reduce:
	REDUCE(Y0, Y1, Y2, Y3, X0)
	REDUCE(Y4, Y5, Y6, Y7, X4)
	REDUCE(Y8, Y9, Y10, Y11, X8)
	EPILOGUE
	TESTL R13, R13
	JZ    nobeta
	STORE(X0)
	ADDQ R9, R10
	STORE(X4)
	ADDQ R9, R10
	STORE(X8)
	VZEROUPPER
	RET

nobeta:
	STORE0(X0)
	ADDQ R9, R10
	STORE0(X4)
	ADDQ R9, R10
	STORE0(X8)
	VZEROUPPER
	RET

// func dot1x4(k int, a *float32, lda int, b *float32, ldb int, nr int, c *float32, ldc int, alpha float32, beta float32)
TEXT ·dot1x4(SB), NOSPLIT, $0-72
	MOVQ a+8(FP), AX
	BROWS
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	KSPLIT
	CMPQ DI, R13
	JGE  tail

loop:
	VMOVUPS     (AX)(DI*1), Y12
	VFMADD231PS (BX)(DI*1), Y12, Y0
	VFMADD231PS (CX)(DI*1), Y12, Y1
	VFMADD231PS (DX)(DI*1), Y12, Y2
	VFMADD231PS (SI)(DI*1), Y12, Y3
	ADDQ        $32, DI
	CMPQ        DI, R13
	JLT         loop

tail:
	TESTQ R14, R14
	JZ    reduce
	TAILMASK
	VMASKMOVPS  (AX)(DI*1), Y15, Y12
	VMASKMOVPS  (BX)(DI*1), Y15, Y13
	VFMADD231PS Y13, Y12, Y0
	VMASKMOVPS  (CX)(DI*1), Y15, Y13
	VFMADD231PS Y13, Y12, Y1
	VMASKMOVPS  (DX)(DI*1), Y15, Y13
	VFMADD231PS Y13, Y12, Y2
	VMASKMOVPS  (SI)(DI*1), Y15, Y13
	VFMADD231PS Y13, Y12, Y3

reduce:
	REDUCE(Y0, Y1, Y2, Y3, X0)
	EPILOGUE
	TESTL R13, R13
	JZ    nobeta
	STORE(X0)
	VZEROUPPER
	RET

nobeta:
	STORE0(X0)
	VZEROUPPER
	RET

// func fmaPeak(n int)
TEXT ·fmaPeak(SB), NOSPLIT, $0-8
	MOVQ   n+0(FP), CX
	ZERO12
	VXORPS Y12, Y12, Y12
	VXORPS Y13, Y13, Y13
	TESTQ  CX, CX
	JLE    peakdone

peakloop:
	VFMADD231PS Y12, Y13, Y0
	VFMADD231PS Y12, Y13, Y1
	VFMADD231PS Y12, Y13, Y2
	VFMADD231PS Y12, Y13, Y3
	VFMADD231PS Y12, Y13, Y4
	VFMADD231PS Y12, Y13, Y5
	VFMADD231PS Y12, Y13, Y6
	VFMADD231PS Y12, Y13, Y7
	VFMADD231PS Y12, Y13, Y8
	VFMADD231PS Y12, Y13, Y9
	VFMADD231PS Y12, Y13, Y10
	VFMADD231PS Y12, Y13, Y11
	DECQ        CX
	JNZ         peakloop

peakdone:
	VZEROUPPER
	RET

// The AVX-512 kernels: the same tiles with 16-lane accumulators (Z0..Z11),
// the last, partial 16 read through the mask K1 (lanes past k zero). Each
// accumulator is folded to 8 lanes (lane l plus lane l+8) and then summed
// and stored as the AVX2 kernels do: the same in both kernels.

// tail16: the masks of t lanes, (1<<t)−1, for t < 16.
DATA tail16<>+0(SB)/2, $0x0000
DATA tail16<>+2(SB)/2, $0x0001
DATA tail16<>+4(SB)/2, $0x0003
DATA tail16<>+6(SB)/2, $0x0007
DATA tail16<>+8(SB)/2, $0x000f
DATA tail16<>+10(SB)/2, $0x001f
DATA tail16<>+12(SB)/2, $0x003f
DATA tail16<>+14(SB)/2, $0x007f
DATA tail16<>+16(SB)/2, $0x00ff
DATA tail16<>+18(SB)/2, $0x01ff
DATA tail16<>+20(SB)/2, $0x03ff
DATA tail16<>+22(SB)/2, $0x07ff
DATA tail16<>+24(SB)/2, $0x0fff
DATA tail16<>+26(SB)/2, $0x1fff
DATA tail16<>+28(SB)/2, $0x3fff
DATA tail16<>+30(SB)/2, $0x7fff
GLOBL tail16<>(SB), RODATA|NOPTR, $32

// KSPLIT16 sets R13 to the bytes of k's whole 16s, R14 to k mod 16, DI to 0.
#define KSPLIT16 \
	MOVQ k+0(FP), R13; \
	MOVQ R13, R14; \
	ANDQ $15, R14; \
	ANDQ $-16, R13; \
	SHLQ $2, R13; \
	XORQ DI, DI

// TAILMASK16 sets K1 to the mask of R14 lanes (R10 := it).
#define TAILMASK16 \
	LEAQ    tail16<>(SB), R10; \
	MOVWLZX (R10)(R14*2), R10; \
	KMOVW   R10, K1

// FOLD adds the upper 8 lanes of z to its lower 8, in y (z's lower half).
#define FOLD(z, y) \
	VEXTRACTF64X4 $1, z, Y15; \
	VADDPS        Y15, y, y

// FMA3Z is FMA3 on 16 lanes; FMA3ZTAIL on the lanes K1 selects.
#define FMA3Z(r, s0, s1, s2) \
	VMOVUPS     (r)(DI*1), Z15; \
	VFMADD231PS Z15, Z12, s0; \
	VFMADD231PS Z15, Z13, s1; \
	VFMADD231PS Z15, Z14, s2

#define FMA3ZTAIL(r, s0, s1, s2) \
	VMOVUPS.Z   (r)(DI*1), K1, Z15; \
	VFMADD231PS Z15, Z12, s0; \
	VFMADD231PS Z15, Z13, s1; \
	VFMADD231PS Z15, Z14, s2

// func dot3x4z(k int, a *float32, lda int, b *float32, ldb int, nr int, c *float32, ldc int, alpha float32, beta float32)
TEXT ·dot3x4z(SB), NOSPLIT, $0-72
	MOVQ a+8(FP), AX
	MOVQ lda+16(FP), R8
	SHLQ $2, R8
	LEAQ (AX)(R8*1), R11
	LEAQ (AX)(R8*2), R12
	BROWS
	ZERO12
	KSPLIT16
	CMPQ DI, R13
	JGE  tail

loop:
	VMOVUPS (AX)(DI*1), Z12
	VMOVUPS (R11)(DI*1), Z13
	VMOVUPS (R12)(DI*1), Z14
	FMA3Z(BX, Z0, Z4, Z8)
	FMA3Z(CX, Z1, Z5, Z9)
	FMA3Z(DX, Z2, Z6, Z10)
	FMA3Z(SI, Z3, Z7, Z11)
	ADDQ $64, DI
	CMPQ DI, R13
	JLT  loop

tail:
	TESTQ R14, R14
	JZ    reduce
	TAILMASK16
	VMOVUPS.Z (AX)(DI*1), K1, Z12
	VMOVUPS.Z (R11)(DI*1), K1, Z13
	VMOVUPS.Z (R12)(DI*1), K1, Z14
	FMA3ZTAIL(BX, Z0, Z4, Z8)
	FMA3ZTAIL(CX, Z1, Z5, Z9)
	FMA3ZTAIL(DX, Z2, Z6, Z10)
	FMA3ZTAIL(SI, Z3, Z7, Z11)

reduce:
	FOLD(Z0, Y0)
	FOLD(Z1, Y1)
	FOLD(Z2, Y2)
	FOLD(Z3, Y3)
	FOLD(Z4, Y4)
	FOLD(Z5, Y5)
	FOLD(Z6, Y6)
	FOLD(Z7, Y7)
	FOLD(Z8, Y8)
	FOLD(Z9, Y9)
	FOLD(Z10, Y10)
	FOLD(Z11, Y11)
	REDUCE(Y0, Y1, Y2, Y3, X0)
	REDUCE(Y4, Y5, Y6, Y7, X4)
	REDUCE(Y8, Y9, Y10, Y11, X8)
	EPILOGUE
	TESTL R13, R13
	JZ    nobeta
	STORE(X0)
	ADDQ R9, R10
	STORE(X4)
	ADDQ R9, R10
	STORE(X8)
	VZEROUPPER
	RET

nobeta:
	STORE0(X0)
	ADDQ R9, R10
	STORE0(X4)
	ADDQ R9, R10
	STORE0(X8)
	VZEROUPPER
	RET

// func dot1x4z(k int, a *float32, lda int, b *float32, ldb int, nr int, c *float32, ldc int, alpha float32, beta float32)
TEXT ·dot1x4z(SB), NOSPLIT, $0-72
	MOVQ a+8(FP), AX
	BROWS
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	KSPLIT16
	CMPQ DI, R13
	JGE  tail

loop:
	VMOVUPS     (AX)(DI*1), Z12
	VFMADD231PS (BX)(DI*1), Z12, Z0
	VFMADD231PS (CX)(DI*1), Z12, Z1
	VFMADD231PS (DX)(DI*1), Z12, Z2
	VFMADD231PS (SI)(DI*1), Z12, Z3
	ADDQ        $64, DI
	CMPQ        DI, R13
	JLT         loop

tail:
	TESTQ R14, R14
	JZ    reduce
	TAILMASK16
	VMOVUPS.Z   (AX)(DI*1), K1, Z12
	VMOVUPS.Z   (BX)(DI*1), K1, Z13
	VFMADD231PS Z13, Z12, Z0
	VMOVUPS.Z   (CX)(DI*1), K1, Z13
	VFMADD231PS Z13, Z12, Z1
	VMOVUPS.Z   (DX)(DI*1), K1, Z13
	VFMADD231PS Z13, Z12, Z2
	VMOVUPS.Z   (SI)(DI*1), K1, Z13
	VFMADD231PS Z13, Z12, Z3

reduce:
	FOLD(Z0, Y0)
	FOLD(Z1, Y1)
	FOLD(Z2, Y2)
	FOLD(Z3, Y3)
	REDUCE(Y0, Y1, Y2, Y3, X0)
	EPILOGUE
	TESTL R13, R13
	JZ    nobeta
	STORE(X0)
	VZEROUPPER
	RET

nobeta:
	STORE0(X0)
	VZEROUPPER
	RET

// func fmaPeak512(n int)
TEXT ·fmaPeak512(SB), NOSPLIT, $0-8
	MOVQ   n+0(FP), CX
	ZERO12
	VXORPS Y12, Y12, Y12
	VXORPS Y13, Y13, Y13
	TESTQ  CX, CX
	JLE    peakdone

peakloop:
	VFMADD231PS Z12, Z13, Z0
	VFMADD231PS Z12, Z13, Z1
	VFMADD231PS Z12, Z13, Z2
	VFMADD231PS Z12, Z13, Z3
	VFMADD231PS Z12, Z13, Z4
	VFMADD231PS Z12, Z13, Z5
	VFMADD231PS Z12, Z13, Z6
	VFMADD231PS Z12, Z13, Z7
	VFMADD231PS Z12, Z13, Z8
	VFMADD231PS Z12, Z13, Z9
	VFMADD231PS Z12, Z13, Z10
	VFMADD231PS Z12, Z13, Z11
	DECQ        CX
	JNZ         peakloop

peakdone:
	VZEROUPPER
	RET
