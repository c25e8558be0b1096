/* CRC-32 (zlib's polynomial, reflected) for the store's records: every record's payload is checked
 * once when written and once when read back, so its cost is paid twice per delivered byte.
 *
 * Two paths with the same result:
 * - slicing by 8 over tables (any CPU; about 1.5-2 GB/s);
 * - on x86-64 CPUs with PCLMULQDQ and SSE4.1, folding 64 bytes per step with carry-less
 *   multiplications (the method of Gopal et al., "Fast CRC Computation for Generic Polynomials Using
 *   PCLMULQDQ Instruction", Intel 2009), then a Barrett reduction to 32 bits: several times faster.
 *   The folding constants are powers of x modulo the CRC polynomial (bit-reflected), fixed by the
 *   polynomial; the tail shorter than 16 bytes goes through the tables.
 */
#include "_crc32.h"

#include <string.h>

static uint32_t crc_table[8][256];
static int use_clmul = 0;
static int have_clmul = 0;

/* ---- tables, slicing by 8 ------------------------------------------------------------------ */

static uint32_t crc_tables(uint32_t crc, const unsigned char *p, size_t len) {
    /* crc is the running (inverted) register here */
    while (len && ((uintptr_t)p & 7)) {
        crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
        len--;
    }
    while (len >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        lo = __builtin_bswap32(lo);
        hi = __builtin_bswap32(hi);
#endif
        lo ^= crc;
        crc = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^
              crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24] ^
              crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
              crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len--)
        crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return crc;
}

/* ---- carry-less multiply folding (x86-64) -------------------------------------------------- */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>

#define CLMUL_MIN 64 /* below this the tables are as fast */

/* One fold: the 128 bits in x carried 128*n bits further and added to the next block. */
__attribute__((target("pclmul,sse4.1")))
static inline __m128i fold(__m128i x, __m128i k, __m128i next) {
    __m128i lo = _mm_clmulepi64_si128(x, k, 0x00);
    __m128i hi = _mm_clmulepi64_si128(x, k, 0x11);
    return _mm_xor_si128(_mm_xor_si128(lo, hi), next);
}

/* The register after ``len`` bytes (len >= 64, a multiple of 16), from the register ``crc``. */
__attribute__((target("pclmul,sse4.1")))
static uint32_t crc_clmul(uint32_t crc, const unsigned char *p, size_t len) {
    /* x^(4*128+32) and x^(4*128-32) mod P; x^(128+32) and x^(128-32); x^64; P and its Barrett
     * quotient mu = x^64 / P: all bit-reflected and shifted as the reflected algorithm wants them. */
    const __m128i k_fold4 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k_fold1 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k_64 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i k_barrett = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    const __m128i low32 = _mm_setr_epi32(-1, 0, -1, 0);

    __m128i x1 = _mm_loadu_si128((const __m128i *)(p + 0));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i x4 = _mm_loadu_si128((const __m128i *)(p + 48));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    p += 64;
    len -= 64;
    while (len >= 64) { /* four lanes, 64 bytes a step */
        x1 = fold(x1, k_fold4, _mm_loadu_si128((const __m128i *)(p + 0)));
        x2 = fold(x2, k_fold4, _mm_loadu_si128((const __m128i *)(p + 16)));
        x3 = fold(x3, k_fold4, _mm_loadu_si128((const __m128i *)(p + 32)));
        x4 = fold(x4, k_fold4, _mm_loadu_si128((const __m128i *)(p + 48)));
        p += 64;
        len -= 64;
    }
    /* the four lanes into one, then the remaining 16-byte blocks */
    x1 = fold(x1, k_fold1, x2);
    x1 = fold(x1, k_fold1, x3);
    x1 = fold(x1, k_fold1, x4);
    while (len >= 16) {
        x1 = fold(x1, k_fold1, _mm_loadu_si128((const __m128i *)p));
        p += 16;
        len -= 16;
    }
    /* 128 bits to 64 */
    __m128i t = _mm_clmulepi64_si128(x1, k_fold1, 0x10);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), t);
    t = _mm_srli_si128(x1, 4);
    x1 = _mm_clmulepi64_si128(_mm_and_si128(x1, low32), k_64, 0x00);
    x1 = _mm_xor_si128(x1, t);
    /* Barrett reduction to 32 bits */
    t = _mm_clmulepi64_si128(_mm_and_si128(x1, low32), k_barrett, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), k_barrett, 0x00);
    x1 = _mm_xor_si128(x1, t);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}

static int cpu_has_clmul(void) {
    unsigned int eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx))
        return 0;
    return (ecx & bit_PCLMUL) && (ecx & bit_SSE4_1);
}
#else
#define CLMUL_MIN ((size_t)-1)
static uint32_t crc_clmul(uint32_t crc, const unsigned char *p, size_t len) {
    return crc_tables(crc, p, len);
}
static int cpu_has_clmul(void) { return 0; }
#endif

void crc32_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = crc_table[0][c & 0xFF] ^ (c >> 8);
            crc_table[k][n] = c;
        }
    }
    have_clmul = use_clmul = cpu_has_clmul();
}

uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t len) {
    crc = ~crc;
    if (use_clmul && len >= CLMUL_MIN) {
        size_t whole = len & ~(size_t)15;
        crc = crc_clmul(crc, p, whole);
        p += whole;
        len -= whole;
    }
    return ~crc_tables(crc, p, len);
}

int crc32_accelerated(void) { return use_clmul; }

void crc32_force_table(int on) { use_clmul = on ? 0 : have_clmul; }
