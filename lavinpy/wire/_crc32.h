/* CRC-32 with zlib's polynomial (reflected 0xEDB88320), as zlib.crc32 computes it. */
#ifndef LAVINPY_CRC32_H
#define LAVINPY_CRC32_H

#include <stddef.h>
#include <stdint.h>

/* Fill the tables and pick the carry-less multiply path if the CPU has it. Call once. */
void crc32_init(void);
/* zlib.crc32(data, crc): the CRC of data appended to a message whose CRC was ``crc`` (0 to start). */
uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t len);
/* 1 when the carry-less multiply path is in use (for tests and benchmarks). */
int crc32_accelerated(void);
/* Force the table path (1) or allow the fast one again (0), so that tests check both alike. */
void crc32_force_table(int on);

#endif
