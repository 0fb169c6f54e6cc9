/* The bounded XML extractor S3's replies are read with (s3_int.h says why
 * not a parser library): the first <tag>, entity decoding. */
#define GB_COMPONENT "s3"

#include "s3_int.h"

/* ---- the XML extractor -------------------------------------------------- */

#define S3_XML_TAG_MAX 64 /* bytes of an element name looked for */

int ckpt_s3_xml_find(const char *p, const char *end, const char *tag, const char **in,
                     const char **in_end, const char **after) {
    size_t tl = strlen(tag);
    char close[S3_XML_TAG_MAX + 4];
    if (tl == 0 || tl >= S3_XML_TAG_MAX)
        return -1;
    int cl = snprintf(close, sizeof close, "</%s>", tag);
    while (p < end) {
        const char *lt = memchr(p, '<', (size_t)(end - p));
        if (lt == NULL || (size_t)(end - lt) < tl + 2)
            return -1;
        const char *r = lt + 1 + tl;
        p = lt + 1;
        if (memcmp(lt + 1, tag, tl) != 0)
            continue;
        const char *start;
        if (*r == '>') {
            start = r + 1;
        } else if (*r == '/' || *r == ' ' || *r == '\t' || *r == '\n' || *r == '\r') {
            const char *gt = memchr(r, '>', (size_t)(end - r)); /* attributes (xmlns) */
            if (gt == NULL)
                return -1;
            if (gt[-1] == '/') { /* <tag/>: empty */
                *in = *in_end = *after = gt + 1;
                return 0;
            }
            start = gt + 1;
        } else {
            continue; /* a longer name: <KeyCount> when looking for <Key> */
        }
        const char *c = memmem(start, (size_t)(end - start), close, (size_t)cl);
        if (c == NULL)
            return -1;
        *in = start;
        *in_end = c;
        *after = c + cl;
        return 0;
    }
    return -1;
}

/* UTF-8 of code point cp into o; its length, 0 if not a character. */
static size_t s3_utf8(unsigned long cp, char *o) {
    if (cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

long ckpt_s3_xml_decode(const char *in, size_t len, char *out, size_t cap) {
    static const struct {
        const char *name;
        char ch;
    } ents[] = {{"amp", '&'}, {"lt", '<'}, {"gt", '>'}, {"quot", '"'}, {"apos", '\''}};
    size_t o = 0;
    if (cap == 0)
        return -1;
    for (size_t i = 0; i < len;) {
        char buf[4];
        size_t n = 1;
        buf[0] = in[i];
        if (in[i] == '\0' || in[i] == '<')
            return -1; /* markup inside a leaf's text: not what S3 sends */
        if (in[i] != '&') {
            i++;
        } else {
            const char *semi = memchr(in + i, ';', len - i < 12 ? len - i : 12);
            if (semi == NULL)
                return -1;
            const char *name = in + i + 1;
            size_t nl = (size_t)(semi - name);
            n = 0;
            if (nl >= 2 && name[0] == '#') {
                unsigned long cp = 0;
                int base = (name[1] == 'x' || name[1] == 'X') ? 16 : 10;
                size_t k = base == 16 ? 2 : 1;
                if (k >= nl)
                    return -1;
                for (; k < nl; k++) {
                    int d = s3_hex((unsigned char)name[k]);
                    if (d < 0 || d >= base)
                        return -1;
                    cp = cp * (unsigned long)base + (unsigned long)d;
                    if (cp > 0x10FFFF)
                        return -1;
                }
                n = s3_utf8(cp, buf);
            } else {
                for (size_t e = 0; e < sizeof ents / sizeof ents[0]; e++)
                    if (strlen(ents[e].name) == nl && memcmp(ents[e].name, name, nl) == 0) {
                        buf[0] = ents[e].ch;
                        n = 1;
                    }
            }
            if (n == 0)
                return -1;
            i = (size_t)(semi - in) + 1;
        }
        if (o + n >= cap)
            return -1;
        memcpy(out + o, buf, n);
        o += n;
    }
    out[o] = '\0';
    return (long)o;
}

long ckpt_s3_xml_get(const char *xml, size_t len, const char *tag, char *out, size_t cap) {
    const char *in, *in_end, *after;
    if (ckpt_s3_xml_find(xml, xml + len, tag, &in, &in_end, &after) != 0)
        return -1;
    return ckpt_s3_xml_decode(in, (size_t)(in_end - in), out, cap);
}
