/* Reduction kernels for every dtype and op. Half types are widened to
 * float32, combined, and rounded back once per combine, identically on every
 * rank. */
#include <math.h>
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

#define COMBINE(op, a, b)                                                                          \
    ((op) == GPL_PROD  ? (a) * (b)                                                                 \
     : (op) == GPL_MIN ? ((b) < (a) ? (b) : (a))                                                   \
     : (op) == GPL_MAX ? ((b) > (a) ? (b) : (a))                                                   \
                       : (a) + (b))

#define LOOP(T, op)                                                                                \
    do {                                                                                           \
        T *restrict a_ = acc;                                                                      \
        const T *restrict b_ = in;                                                                 \
        switch (op) {                                                                              \
        case GPL_PROD:                                                                             \
            for (size_t i = 0; i < count; i++)                                                     \
                a_[i] = a_[i] * b_[i];                                                             \
            break;                                                                                 \
        case GPL_MIN:                                                                              \
            for (size_t i = 0; i < count; i++)                                                     \
                a_[i] = b_[i] < a_[i] ? b_[i] : a_[i];                                             \
            break;                                                                                 \
        case GPL_MAX:                                                                              \
            for (size_t i = 0; i < count; i++)                                                     \
                a_[i] = b_[i] > a_[i] ? b_[i] : a_[i];                                             \
            break;                                                                                 \
        default:                                                                                   \
            for (size_t i = 0; i < count; i++)                                                     \
                a_[i] = a_[i] + b_[i];                                                             \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

void gpl_reduce_into(void *acc, const void *in, size_t count, gpl_dtype_t t, gpl_op_t op) {
    switch (t) {
    case GPL_FLOAT32:
        LOOP(float, op);
        return;
    case GPL_FLOAT64:
        LOOP(double, op);
        return;
    case GPL_INT32: {
        /* wrap-around, not undefined overflow */
        uint32_t *a = acc;
        const uint32_t *b = in;
        const int32_t *sa = acc, *sb = in;
        for (size_t i = 0; i < count; i++) {
            switch (op) {
            case GPL_PROD:
                a[i] = a[i] * b[i];
                break;
            case GPL_MIN:
                a[i] = sb[i] < sa[i] ? b[i] : a[i];
                break;
            case GPL_MAX:
                a[i] = sb[i] > sa[i] ? b[i] : a[i];
                break;
            default:
                a[i] = a[i] + b[i];
            }
        }
        return;
    }
    case GPL_INT64: {
        uint64_t *a = acc;
        const uint64_t *b = in;
        const int64_t *sa = acc, *sb = in;
        for (size_t i = 0; i < count; i++) {
            switch (op) {
            case GPL_PROD:
                a[i] = a[i] * b[i];
                break;
            case GPL_MIN:
                a[i] = sb[i] < sa[i] ? b[i] : a[i];
                break;
            case GPL_MAX:
                a[i] = sb[i] > sa[i] ? b[i] : a[i];
                break;
            default:
                a[i] = a[i] + b[i];
            }
        }
        return;
    }
    case GPL_FLOAT16: {
        uint16_t *a = acc;
        const uint16_t *b = in;
        for (size_t i = 0; i < count; i++) {
            float x = h2f(a[i]), y = h2f(b[i]);
            a[i] = f2h(COMBINE(op, x, y));
        }
        return;
    }
    case GPL_BFLOAT16: {
        uint16_t *a = acc;
        const uint16_t *b = in;
        for (size_t i = 0; i < count; i++) {
            float x = b2f(a[i]), y = b2f(b[i]);
            a[i] = f2b(COMBINE(op, x, y));
        }
        return;
    }
    default:
        return;
    }
}

void gpl_scale_avg(void *buf, size_t count, gpl_dtype_t t, int n) {
    switch (t) {
    case GPL_FLOAT32: {
        float *a = buf;
        for (size_t i = 0; i < count; i++)
            a[i] = a[i] / (float)n;
        return;
    }
    case GPL_FLOAT64: {
        double *a = buf;
        for (size_t i = 0; i < count; i++)
            a[i] = a[i] / (double)n;
        return;
    }
    case GPL_INT32: {
        int32_t *a = buf;
        for (size_t i = 0; i < count; i++)
            a[i] = a[i] / n;
        return;
    }
    case GPL_INT64: {
        int64_t *a = buf;
        for (size_t i = 0; i < count; i++)
            a[i] = a[i] / n;
        return;
    }
    case GPL_FLOAT16: {
        uint16_t *a = buf;
        for (size_t i = 0; i < count; i++)
            a[i] = f2h(h2f(a[i]) / (float)n);
        return;
    }
    case GPL_BFLOAT16: {
        uint16_t *a = buf;
        for (size_t i = 0; i < count; i++)
            a[i] = f2b(b2f(a[i]) / (float)n);
        return;
    }
    default:
        return;
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
