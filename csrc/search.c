/* search.c - reading error side files for a search of the queue's jobs by error text.  See ringq.h
 * ("search") for the contract.  One pass over the file's bytes: the frames, their CRC and a
 * case-insensitive substring test of each text, so a search over many failed jobs costs one read
 * of each side file and no per-frame work in Python. */
#include "ringq.h"

#include <stddef.h>
#include <string.h>

static inline uint8_t fold(uint8_t c) { return (c >= 'A' && c <= 'Z') ? (uint8_t)(c + 32) : c; }

static int contains(const uint8_t *text, size_t n, const uint8_t *needle, size_t m) {
    if (m == 0) return 1;
    if (m > n) return 0;
    uint8_t first = fold(needle[0]);
    for (size_t i = 0; i + m <= n; i++) {
        if (fold(text[i]) != first) continue;
        size_t k = 1;
        while (k < m && fold(text[i + k]) == fold(needle[k])) k++;
        if (k == m) return 1;
    }
    return 0;
}

static inline uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int64_t ringq_frames_scan(const uint8_t *buf, size_t len, const uint8_t *needle, size_t nlen,
                          uint32_t *slots, uint32_t *lcs, uint8_t *match, size_t cap) {
    if ((!buf && len) || (!needle && nlen) || (cap && (!slots || !lcs || !match))) return RINGQ_EINVAL;
    int64_t found = 0;
    size_t pos = 0;
    while (len - pos >= 16) {
        uint32_t n = le32(buf + pos), crc = le32(buf + pos + 4);
        if ((size_t)n > len - pos - 16) break;
        size_t end = pos + 16 + n;
        if (ringq_crc32c(0, buf + pos + 8, 8 + (size_t)n) == crc) {
            if ((size_t)found < cap) {
                slots[found] = le32(buf + pos + 8);
                lcs[found] = le32(buf + pos + 12);
                match[found] = (uint8_t)contains(buf + pos + 16, n, needle, nlen);
            }
            found++;
        }
        pos = end;
    }
    return found;
}
