/* SPDX-License-Identifier: MIT */
/*
 * Validation of tensor ops (opcodes from ELTWISE on), shared by the driver,
 * which rejects a bad op at SUBMIT with -EINVAL, and the device model, which
 * checks again what it fetched and completes a bad op with the status these
 * functions return. One implementation, so the two can never disagree.
 *
 * The structures are in host byte order here; the device converts the
 * little-endian parameter block first.
 */
#ifndef NPU_TENSOR_H
#define NPU_TENSOR_H

#include "npu_hw.h"

/* Bytes per element of @dtype, 0 if unknown. */
static inline __u32 npu_dtype_size(__u32 dtype)
{
	switch (dtype) {
	case NPU_DTYPE_FP32:
	case NPU_DTYPE_INT32:
		return 4;
	case NPU_DTYPE_FP16:
	case NPU_DTYPE_BF16:
		return 2;
	case NPU_DTYPE_INT8:
	case NPU_DTYPE_BOOL:
		return 1;
	default:
		return 0;
	}
}

/* Does ELTWISE @kind compare (out BOOL) rather than compute? */
static inline int npu_eltwise_is_compare(__u32 kind)
{
	return kind >= NPU_ELTWISE_EQ && kind < NPU_ELTWISE_COUNT;
}

static inline int npu_dtype_is_float(__u32 dtype)
{
	return dtype == NPU_DTYPE_FP32 || dtype == NPU_DTYPE_FP16 ||
	       dtype == NPU_DTYPE_BF16;
}

/* Number of elements; valid only after npu_tensor_check(). */
static inline __u64 npu_tensor_numel(const struct npu_hw_tensor *t)
{
	__u64 n = 1;
	__u32 d;

	for (d = 0; d < t->ndim; d++)
		n *= t->shape[d];
	return n;
}

/*
 * Bytes from element [0, ..., 0] to the end of the furthest element;
 * valid only after npu_tensor_check().
 */
static inline __u64 npu_tensor_extent(const struct npu_hw_tensor *t)
{
	__u64 last = 0;
	__u32 d;

	for (d = 0; d < t->ndim; d++)
		last += (__u64)(t->shape[d] - 1) * t->strides[d];
	return (last + 1) * npu_dtype_size(t->dtype);
}

/* Row-major and dense: what an output operand must be. */
static inline int npu_tensor_is_contiguous(const struct npu_hw_tensor *t)
{
	__u64 want = 1;
	__u32 d;

	for (d = t->ndim; d-- > 0;) {
		if (t->shape[d] > 1 && t->strides[d] != want)
			return 0;
		want *= t->shape[d];
	}
	return 1;
}

/*
 * No two elements share an address: sorted by stride, each dimension of
 * size > 1 steps past the extent of the smaller ones (what a strided
 * CONVERT output must be).
 */
static inline int npu_tensor_is_disjoint(const struct npu_hw_tensor *t)
{
	__u32 idx[NPU_MAX_RANK], n = 0, i, j, k;
	__u64 extent = 0;

	for (i = 0; i < t->ndim; i++) {
		if (t->shape[i] < 2)
			continue;
		/* Insertion sort by stride: at most NPU_MAX_RANK entries. */
		for (j = n; j > 0 && t->strides[idx[j - 1]] > t->strides[i]; j--)
			idx[j] = idx[j - 1];
		idx[j] = i;
		n++;
	}
	for (i = 0; i < n; i++) {
		k = idx[i];
		if (t->strides[k] <= extent)
			return 0;
		extent += (__u64)(t->shape[k] - 1) * t->strides[k];
	}
	return 1;
}

static inline int npu_tensor_is_zero(const struct npu_hw_tensor *t)
{
	const __u32 *w = (const __u32 *)t;
	__u32 i;

	for (i = 0; i < sizeof(*t) / sizeof(*w); i++)
		if (w[i])
			return 0;
	return 1;
}

/* One operand on its own: dtype, rank, shape, strides and size limits. */
static inline __u32 npu_tensor_check(const struct npu_hw_tensor *t)
{
	__u64 last = 0, numel = 1;
	__u32 d;

	if (!npu_dtype_size(t->dtype) || t->ndim < 1 || t->ndim > NPU_MAX_RANK)
		return NPU_ST_BAD_ARGS;
	for (d = 0; d < NPU_MAX_RANK; d++) {
		if (d >= t->ndim) {
			if (t->shape[d] || t->strides[d])
				return NPU_ST_BAD_RESERVED;
			continue;
		}
		if (t->shape[d] < 1 || t->shape[d] > NPU_MAX_STRIDE ||
		    t->strides[d] > NPU_MAX_STRIDE)
			return NPU_ST_BAD_ARGS;
		numel *= t->shape[d];
		if (numel > NPU_MAX_ELEMS)
			return NPU_ST_BAD_ARGS;
		last += (__u64)(t->shape[d] - 1) * t->strides[d];
	}
	if (last >= NPU_MAX_XFER / 4)
		return NPU_ST_BAD_ARGS;
	return NPU_ST_OK;
}

/* Operands an op reads and writes (the last one is the output). */
static inline __u32 npu_tensor_op_operands(__u32 opcode)
{
	switch (opcode) {
	case NPU_OP_ELTWISE:
		return 3;
	case NPU_OP_UNARY:
	case NPU_OP_CONVERT:
	case NPU_OP_REDUCE:
	case NPU_OP_SOFTMAX:
		return 2;
	case NPU_OP_MATMUL:
		return 3;
	case NPU_OP_LAYERNORM:
	case NPU_OP_LINEAR:
	case NPU_OP_CONV2D:
		return 4;
	case NPU_OP_POOL2D:
		return 2;
	case NPU_OP_REQUANT:
		return 3;
	case NPU_OP_SELECT:
		return 4;
	default:
		return 0;
	}
}

/*
 * Capability bits a tensor op needs beyond its opcode's, from its @kind,
 * params and output @out (npu_tensor_op_supported() covers the opcode).
 */
static inline __u32 npu_tensor_op_features(__u32 opcode, __u32 kind, const __u32 *params,
					   const struct npu_hw_tensor *out)
{
	if ((opcode == NPU_OP_MATMUL || opcode == NPU_OP_LINEAR || opcode == NPU_OP_CONV2D) &&
	    kind == NPU_ACT_RELU6)
		return NPU_CAP_ACT_RELU6;
	if (opcode == NPU_OP_POOL2D &&
	    params[NPU_POOL_P_FLAGS] & (NPU_POOL_F_GEOMETRY | NPU_POOL_F_CEIL))
		return NPU_CAP_POOL_GEOMETRY;
	if (opcode == NPU_OP_CONVERT && out->ndim <= NPU_MAX_RANK &&
	    !npu_tensor_is_contiguous(out))
		return NPU_CAP_STRIDED_OUT;
	if (opcode == NPU_OP_CONV2D &&
	    params[NPU_CONV_P_FLAGS] & NPU_CONV_F_ACCUMULATE)
		return NPU_CAP_CONV_ACCUMULATE;
	return 0;
}

/* Does a device with capability bits @caps implement tensor op @opcode? */
static inline int npu_tensor_op_supported(__u32 opcode, __u32 caps)
{
	switch (opcode) {
	case NPU_OP_ELTWISE:
	case NPU_OP_UNARY:
	case NPU_OP_CONVERT:
		return !!(caps & NPU_CAP_TENSOR);
	case NPU_OP_REDUCE:
	case NPU_OP_SOFTMAX:
	case NPU_OP_LAYERNORM:
		return !!(caps & NPU_CAP_REDUCE);
	case NPU_OP_MATMUL:
	case NPU_OP_LINEAR:
		return !!(caps & NPU_CAP_MATMUL);
	case NPU_OP_CONV2D:
	case NPU_OP_POOL2D:
		return !!(caps & NPU_CAP_CONV);
	case NPU_OP_REQUANT:
		return !!(caps & NPU_CAP_QUANT);
	case NPU_OP_SELECT:
		return !!(caps & NPU_CAP_SELECT);
	default:
		return 0;
	}
}

/* Does UNARY @kind take float dtypes only (all but RELU, ABS and NEG)? */
static inline int npu_unary_float_only(__u32 kind)
{
	return kind != NPU_UNARY_RELU && kind != NPU_UNARY_ABS && kind != NPU_UNARY_NEG;
}

/* Params an op uses (the others must be zero); POOL2D's depend on its flags. */
static inline __u32 npu_tensor_op_params(__u32 opcode, const __u32 *params)
{
	switch (opcode) {
	case NPU_OP_REDUCE:
	case NPU_OP_SOFTMAX:
	case NPU_OP_MATMUL:
	case NPU_OP_LINEAR:
	case NPU_OP_REQUANT:
		return 1;
	case NPU_OP_LAYERNORM:
		return 2;
	case NPU_OP_CONV2D:
		return 9;
	case NPU_OP_POOL2D:
		return params[NPU_POOL_P_FLAGS] & NPU_POOL_F_GEOMETRY ? 11 : 7;
	default:
		return 0;
	}
}

/*
 * Output size of a window of @k taps spaced @dil apart, moved by @stride
 * over @in elements padded by @pad on both sides; 0 if none fits.
 */
static inline __u64 npu_window_out(__u32 in, __u32 k, __u32 stride, __u32 pad,
				   __u32 dil)
{
	__u64 span = (__u64)dil * (k - 1) + 1, padded = (__u64)in + 2ull * pad;

	if (!k || !stride || !dil || span > padded)
		return 0;
	return (padded - span) / stride + 1;
}

/* CONV2D shapes and geometry (ranks already checked to be valid). */
static inline int npu_tensor_conv_ok(const struct npu_tensor_params *p)
{
	const struct npu_hw_tensor *in = &p->t[0], *w = &p->t[1];
	const struct npu_hw_tensor *b = &p->t[2], *out = &p->t[3];
	const __u32 *q = p->params;
	__u32 g = q[NPU_CONV_P_GROUPS];

	if (in->ndim != 4 || w->ndim != 4 || b->ndim != 4 || out->ndim != 4 || !g ||
	    q[NPU_CONV_P_PAD_H] > NPU_MAX_PAD || q[NPU_CONV_P_PAD_W] > NPU_MAX_PAD ||
	    in->shape[1] % g || w->shape[0] % g || w->shape[1] != in->shape[1] / g)
		return 0;
	if (out->shape[0] != in->shape[0] || out->shape[1] != w->shape[0] ||
	    b->shape[0] != 1 || b->shape[1] != w->shape[0] || b->shape[2] != 1 ||
	    b->shape[3] != 1)
		return 0;
	return out->shape[2] == npu_window_out(in->shape[2], w->shape[2],
					       q[NPU_CONV_P_STRIDE_H], q[NPU_CONV_P_PAD_H],
					       q[NPU_CONV_P_DIL_H]) &&
	       out->shape[3] == npu_window_out(in->shape[3], w->shape[3],
					       q[NPU_CONV_P_STRIDE_W], q[NPU_CONV_P_PAD_W],
					       q[NPU_CONV_P_DIL_W]);
}

/*
 * POOL2D output size along one axis (npu_hw.h): @n elements padded by @pb
 * and @pe, @k taps @dil apart moved by @stride, rounded up with @ceil;
 * 0 if no window fits or a pad reaches the window's span.
 */
static inline __u64 npu_pool_out(__u32 n, __u32 k, __u32 stride, __u32 pb,
				 __u32 pe, __u32 dil, int ceil)
{
	__u64 span = (__u64)dil * (k - 1) + 1, padded = (__u64)n + pb + pe, out;

	if (!k || !stride || !dil || span > padded || pb >= span || pe >= span)
		return 0;
	out = (padded - span) / stride + 1;
	if (ceil && (padded - span) % stride && out * stride < (__u64)n + pb)
		out++;
	return out;
}

/* POOL2D shapes and geometry. */
static inline int npu_tensor_pool_ok(const struct npu_tensor_params *p)
{
	const struct npu_hw_tensor *in = &p->t[0], *out = &p->t[1];
	const __u32 *q = p->params;
	__u32 flags = q[NPU_POOL_P_FLAGS], i;
	__u32 geo[4] = { q[NPU_POOL_P_PAD_H], q[NPU_POOL_P_PAD_W], 1, 1 };
	int ceil = !!(flags & NPU_POOL_F_CEIL);

	if (in->ndim != 4 || out->ndim != 4 || flags & ~NPU_POOL_F_MASK ||
	    out->shape[0] != in->shape[0] || out->shape[1] != in->shape[1])
		return 0;
	if (flags & NPU_POOL_F_GEOMETRY)
		for (i = 0; i < 4; i++)
			geo[i] = q[NPU_POOL_P_PAD_H_END + i];
	else if (ceil)
		return 0;
	return out->shape[2] == npu_pool_out(in->shape[2], q[NPU_POOL_P_KH],
					     q[NPU_POOL_P_STRIDE_H], q[NPU_POOL_P_PAD_H],
					     geo[0], geo[2], ceil) &&
	       out->shape[3] == npu_pool_out(in->shape[3], q[NPU_POOL_P_KW],
					     q[NPU_POOL_P_STRIDE_W], q[NPU_POOL_P_PAD_W],
					     geo[1], geo[3], ceil);
}

/* Is the params word @v a zero point: -128..127 as 32-bit two's complement? */
static inline int npu_zp_ok(__u32 v)
{
	return v <= (__u32)NPU_ZP_MAX || v >= (__u32)NPU_ZP_MIN;
}

/*
 * The operand dtypes of MATMUL/LINEAR (@opcode, @n operands) or CONV2D
 * and their zero-point word @zp: NPU_ST_OK, or the status of the op.
 * Float: one float dtype for all operands, @zp 0. Integer: a and b
 * INT8, bias INT32, out INT32 or INT8, kind not GELU, @zp in -128..127.
 */
static inline __u32 npu_tensor_mm_dtypes(__u32 opcode, __u32 kind, __u32 n,
					 const struct npu_tensor_params *p, __u32 zp)
{
	const struct npu_hw_tensor *out = &p->t[n - 1];
	__u32 i;

	if (p->t[0].dtype != NPU_DTYPE_INT8) {
		if (zp)
			return NPU_ST_BAD_RESERVED;
		for (i = 0; i + 1 < n; i++)
			if (p->t[i].dtype != out->dtype)
				return NPU_ST_BAD_ARGS;
		if (kind >= NPU_ACT_COUNT || !npu_dtype_is_float(out->dtype))
			return NPU_ST_BAD_ARGS;
		return NPU_ST_OK;
	}
	if (p->t[1].dtype != NPU_DTYPE_INT8 ||
	    (opcode != NPU_OP_MATMUL && p->t[2].dtype != NPU_DTYPE_INT32) ||
	    (out->dtype != NPU_DTYPE_INT32 && out->dtype != NPU_DTYPE_INT8) ||
	    kind >= NPU_ACT_GELU)
		return NPU_ST_BAD_ARGS;
	return NPU_ST_OK;
}

/* Is the fp32 bit pattern @bits a finite number above zero? */
static inline int npu_f32_bits_positive_finite(__u32 bits)
{
	return !(bits & 0x80000000u) && bits != 0 && (bits & 0x7f800000u) != 0x7f800000u;
}

/* REDUCE: out is in with the reduced axes (bit mask @axes) set to 1. */
static inline int npu_tensor_reduces_to(const struct npu_hw_tensor *in,
					const struct npu_hw_tensor *out, __u32 axes)
{
	__u32 d;

	if (!axes || axes >= (1u << in->ndim) || in->ndim != out->ndim)
		return 0;
	for (d = 0; d < in->ndim; d++)
		if (out->shape[d] != ((axes & (1u << d)) ? 1 : in->shape[d]))
			return 0;
	return 1;
}

/* MATMUL/LINEAR: shapes of a [..., M, K] @ b [..., K, N] -> out [..., M, N]. */
static inline int npu_tensor_matmul_shapes(const struct npu_hw_tensor *a,
					   const struct npu_hw_tensor *b,
					   const struct npu_hw_tensor *out)
{
	__u32 r = out->ndim, d;

	if (r < 2 || a->ndim != r || b->ndim != r ||
	    a->shape[r - 2] != out->shape[r - 2] ||
	    b->shape[r - 1] != out->shape[r - 1] ||
	    a->shape[r - 1] != b->shape[r - 2])
		return 0;
	for (d = 0; d + 2 < r; d++)
		if ((a->shape[d] != out->shape[d] && a->shape[d] != 1) ||
		    (b->shape[d] != out->shape[d] && b->shape[d] != 1))
			return 0;
	return 1;
}

/* LAYERNORM: @p (gamma or beta) has in's size in the last @n axes, else 1. */
static inline int npu_tensor_is_norm_param(const struct npu_hw_tensor *p,
					   const struct npu_hw_tensor *in, __u32 n)
{
	__u32 d;

	if (p->ndim != in->ndim)
		return 0;
	for (d = 0; d < in->ndim; d++)
		if (p->shape[d] != (d + n >= in->ndim ? in->shape[d] : 1))
			return 0;
	return 1;
}

static inline int npu_tensor_same_shape(const struct npu_hw_tensor *a,
					const struct npu_hw_tensor *b)
{
	__u32 d;

	if (a->ndim != b->ndim)
		return 0;
	for (d = 0; d < a->ndim; d++)
		if (a->shape[d] != b->shape[d])
			return 0;
	return 1;
}

/* Can @in be broadcast to @out (same rank, each dim equal or 1)? */
static inline int npu_tensor_broadcasts_to(const struct npu_hw_tensor *in,
					   const struct npu_hw_tensor *out)
{
	__u32 d;

	if (in->ndim != out->ndim)
		return 0;
	for (d = 0; d < in->ndim; d++)
		if (in->shape[d] != out->shape[d] && in->shape[d] != 1)
			return 0;
	return 1;
}

/* A whole tensor op: NPU_ST_OK, or the status the device completes it with. */
static inline __u32 npu_tensor_op_check(__u32 opcode, __u32 kind,
					const struct npu_tensor_params *p)
{
	__u32 n = npu_tensor_op_operands(opcode);
	const struct npu_hw_tensor *out;
	__u32 i, st;

	if (!n)
		return NPU_ST_BAD_OPCODE;
	for (i = 0; i < NPU_TENSOR_OPERANDS; i++) {
		st = i < n ? npu_tensor_check(&p->t[i]) :
			     (npu_tensor_is_zero(&p->t[i]) ? NPU_ST_OK : NPU_ST_BAD_RESERVED);
		if (st != NPU_ST_OK)
			return st;
	}
	for (i = npu_tensor_op_params(opcode, p->params); i < NPU_TENSOR_PARAMS; i++)
		if (p->params[i])
			return NPU_ST_BAD_RESERVED;
	out = &p->t[n - 1];
	if (!npu_tensor_is_contiguous(out) &&
	    (opcode != NPU_OP_CONVERT || !npu_tensor_is_disjoint(out)))
		return NPU_ST_BAD_ARGS;
	/* BOOL: a comparison's operands and output, CONVERT's and SELECT's. */
	if (opcode != NPU_OP_CONVERT && opcode != NPU_OP_SELECT &&
	    !(opcode == NPU_OP_ELTWISE && npu_eltwise_is_compare(kind)))
		for (i = 0; i < n; i++)
			if (p->t[i].dtype == NPU_DTYPE_BOOL)
				return NPU_ST_BAD_ARGS;

	switch (opcode) {
	case NPU_OP_ELTWISE:
		if (kind >= NPU_ELTWISE_COUNT || p->t[0].dtype != p->t[1].dtype ||
		    out->dtype != (npu_eltwise_is_compare(kind) ? (__u32)NPU_DTYPE_BOOL :
								    p->t[0].dtype) ||
		    !npu_tensor_broadcasts_to(&p->t[0], out) ||
		    !npu_tensor_broadcasts_to(&p->t[1], out) ||
		    (kind == NPU_ELTWISE_DIV && !npu_dtype_is_float(out->dtype)))
			return NPU_ST_BAD_ARGS;
		return NPU_ST_OK;
	case NPU_OP_UNARY:
		if (kind >= NPU_UNARY_COUNT || p->t[0].dtype != out->dtype ||
		    !npu_tensor_same_shape(&p->t[0], out) ||
		    (npu_unary_float_only(kind) && !npu_dtype_is_float(out->dtype)))
			return NPU_ST_BAD_ARGS;
		return NPU_ST_OK;
	case NPU_OP_REDUCE:
		if (kind >= NPU_REDUCE_COUNT || p->t[0].dtype != out->dtype ||
		    !npu_tensor_reduces_to(&p->t[0], out, p->params[0]) ||
		    (kind == NPU_REDUCE_MEAN && !npu_dtype_is_float(out->dtype)))
			return NPU_ST_BAD_ARGS;
		return NPU_ST_OK;
	case NPU_OP_SOFTMAX:
		if (kind >= NPU_SOFTMAX_COUNT || p->t[0].dtype != out->dtype ||
		    !npu_dtype_is_float(out->dtype) ||
		    !npu_tensor_same_shape(&p->t[0], out) || p->params[0] >= out->ndim)
			return NPU_ST_BAD_ARGS;
		return NPU_ST_OK;
	case NPU_OP_LAYERNORM:
		for (i = 0; i < 3; i++)
			if (p->t[i].dtype != out->dtype)
				return NPU_ST_BAD_ARGS;
		if (kind || !npu_dtype_is_float(out->dtype) ||
		    !npu_tensor_same_shape(&p->t[0], out) ||
		    p->params[0] < 1 || p->params[0] > out->ndim ||
		    !npu_tensor_is_norm_param(&p->t[1], out, p->params[0]) ||
		    !npu_tensor_is_norm_param(&p->t[2], out, p->params[0]) ||
		    !npu_f32_bits_positive_finite(p->params[1]))
			return NPU_ST_BAD_ARGS;
		return NPU_ST_OK;
	case NPU_OP_MATMUL:
	case NPU_OP_LINEAR:
		st = npu_tensor_mm_dtypes(opcode, kind, n, p, p->params[NPU_MM_P_IN_ZP]);
		if (st != NPU_ST_OK)
			return st;
		if (!npu_tensor_matmul_shapes(&p->t[0], &p->t[1], out) ||
		    (opcode == NPU_OP_LINEAR &&
		     !npu_tensor_is_norm_param(&p->t[2], out, 1)))
			return NPU_ST_BAD_ARGS;
		return npu_zp_ok(p->params[NPU_MM_P_IN_ZP]) ? NPU_ST_OK : NPU_ST_BAD_QUANT;
	case NPU_OP_CONV2D:
		st = npu_tensor_mm_dtypes(opcode, kind, n, p, p->params[NPU_CONV_P_IN_ZP]);
		if (st != NPU_ST_OK)
			return st;
		if (!npu_tensor_conv_ok(p) ||
		    p->params[NPU_CONV_P_FLAGS] & ~NPU_CONV_F_MASK ||
		    (p->params[NPU_CONV_P_FLAGS] & NPU_CONV_F_ACCUMULATE &&
		     !npu_dtype_is_float(out->dtype)))
			return NPU_ST_BAD_ARGS;
		return npu_zp_ok(p->params[NPU_CONV_P_IN_ZP]) ? NPU_ST_OK : NPU_ST_BAD_QUANT;
	case NPU_OP_REQUANT:
		if (kind >= NPU_ACT_GELU || p->t[0].dtype != NPU_DTYPE_INT32 ||
		    p->t[1].dtype != NPU_DTYPE_FP32 || out->dtype != NPU_DTYPE_INT8 ||
		    !npu_tensor_same_shape(&p->t[0], out) ||
		    !npu_tensor_broadcasts_to(&p->t[1], out))
			return NPU_ST_BAD_ARGS;
		return npu_zp_ok(p->params[NPU_REQUANT_P_OUT_ZP]) ? NPU_ST_OK :
								      NPU_ST_BAD_QUANT;
	case NPU_OP_POOL2D:
		if (kind >= NPU_POOL_COUNT || p->t[0].dtype != out->dtype ||
		    !npu_dtype_is_float(out->dtype) || !npu_tensor_pool_ok(p))
			return NPU_ST_BAD_ARGS;
		return NPU_ST_OK;
	case NPU_OP_SELECT:
		if (kind || p->t[0].dtype != NPU_DTYPE_BOOL ||
		    p->t[1].dtype != out->dtype || p->t[2].dtype != out->dtype)
			return NPU_ST_BAD_ARGS;
		for (i = 0; i < 3; i++)
			if (!npu_tensor_broadcasts_to(&p->t[i], out))
				return NPU_ST_BAD_ARGS;
		return NPU_ST_OK;
	default: /* NPU_OP_CONVERT */
		if (kind || !npu_tensor_same_shape(&p->t[0], out))
			return NPU_ST_BAD_ARGS;
		return NPU_ST_OK;
	}
}

#endif /* NPU_TENSOR_H */
