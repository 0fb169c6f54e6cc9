/* Reduction kernels for every dtype and op. Half types are widened to
 * float32 by the caller, reduced there, and rounded back once. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpl_int.h"

static float h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, f;
    if (exp == 0) {
        if (man == 0) {
            f = sign;
        } else { /* subnormal */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ff;
            f = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        f = sign | 0x7f800000u | (man << 13);
    } else {
        f = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float out;
    memcpy(&out, &f, 4);
    return out;
}

static uint16_t f2h(float x) {
    uint32_t f;
    memcpy(&f, &x, 4);
    uint32_t sign = (f >> 16) & 0x8000;
    int32_t exp = (int32_t)((f >> 23) & 0xff) - 127 + 15;
    uint32_t man = f & 0x7fffff;
    if (((f >> 23) & 0xff) == 0xff) /* inf or nan */
        return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10)
            return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (man >> 13);
    uint32_t rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
        h++;
    return (uint16_t)h;
}

static float b2f(uint16_t b) {
    uint32_t f = (uint32_t)b << 16;
    float out;
    memcpy(&out, &f, 4);
    return out;
}

static uint16_t f2b(float x) {
    uint32_t f;
    memcpy(&f, &x, 4);
    if ((f & 0x7fffffff) > 0x7f800000)
        return (uint16_t)((f >> 16) | 0x40);
    f += 0x7fff + ((f >> 16) & 1);
    return (uint16_t)(f >> 16);
}

/* One loop per op, the switch outside it. Integers combine as unsigned
 * (wrap-around, not undefined overflow) and compare as signed. */
#define LOOP(T, S, op)                                                                             \
    do {                                                                                           \
        T *restrict a_ = acc;                                                                      \
        const T *restrict b_ = in;                                                                 \
        const S *sa_ = acc, *sb_ = in;                                                             \
        switch (op) {                                                                              \
        case GPL_PROD:                                                                             \
            for (size_t i = 0; i < count; i++)                                                     \
                a_[i] = a_[i] * b_[i];                                                             \
            break;                                                                                 \
        case GPL_MIN:                                                                              \
            for (size_t i = 0; i < count; i++)                                                     \
                a_[i] = sb_[i] < sa_[i] ? b_[i] : a_[i];                                           \
            break;                                                                                 \
        case GPL_MAX:                                                                              \
            for (size_t i = 0; i < count; i++)                                                     \
                a_[i] = sb_[i] > sa_[i] ? b_[i] : a_[i];                                           \
            break;                                                                                 \
        default: /* sum; avg is a sum scaled afterwards */                                         \
            for (size_t i = 0; i < count; i++)                                                     \
                a_[i] = a_[i] + b_[i];                                                             \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

/* Half types never get here: they are widened to float32 first (gpl_widen). */
void gpl_reduce_into(void *acc, const void *in, size_t count, gpl_dtype_t t, gpl_op_t op) {
    switch (t) {
    case GPL_FLOAT32:
        LOOP(float, float, op);
        return;
    case GPL_FLOAT64:
        LOOP(double, double, op);
        return;
    case GPL_INT32:
        LOOP(uint32_t, int32_t, op);
        return;
    case GPL_INT64:
        LOOP(uint64_t, int64_t, op);
        return;
    default:
        abort(); /* a half type: a caller skipped gpl_widen */
    }
}

#define SCALE(T, D)                                                                                \
    do {                                                                                           \
        T *a_ = buf;                                                                               \
        for (size_t i = 0; i < count; i++)                                                         \
            a_[i] = a_[i] / (D);                                                                   \
    } while (0)

void gpl_scale_avg(void *buf, size_t count, gpl_dtype_t t, int n) {
    switch (t) {
    case GPL_FLOAT32:
        SCALE(float, (float)n);
        return;
    case GPL_FLOAT64:
        SCALE(double, (double)n);
        return;
    case GPL_INT32:
        SCALE(int32_t, n);
        return;
    case GPL_INT64:
        SCALE(int64_t, n);
        return;
    default:
        abort(); /* a half type: a caller skipped gpl_widen */
    }
}

size_t gpl_dtype_size(gpl_dtype_t t) {
    switch (t) {
    case GPL_FLOAT32:
    case GPL_INT32:
        return 4;
    case GPL_FLOAT64:
    case GPL_INT64:
        return 8;
    case GPL_FLOAT16:
    case GPL_BFLOAT16:
        return 2;
    default:
        return 0;
    }
}

void gpl_widen(float *dst, const void *src, size_t count, gpl_dtype_t t) {
    const uint16_t *s = src;
    if (t == GPL_FLOAT16)
        for (size_t i = 0; i < count; i++)
            dst[i] = h2f(s[i]);
    else
        for (size_t i = 0; i < count; i++)
            dst[i] = b2f(s[i]);
}

void gpl_narrow(void *dst, const float *src, size_t count, gpl_dtype_t t) {
    uint16_t *d = dst;
    if (t == GPL_FLOAT16)
        for (size_t i = 0; i < count; i++)
            d[i] = f2h(src[i]);
    else
        for (size_t i = 0; i < count; i++)
            d[i] = f2b(src[i]);
}
