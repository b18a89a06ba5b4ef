/* ProcessPrng, which Rust's standard library takes its random keys from on
 * Windows 10 and later, for Wine releases that lack bcryptprimitives.dll
 * (Debian 12's Wine 8). Built into the Wine prefix the job mechanics run in
 * (scripts/wine-test.sh); never part of palisade. It asks advapi32's
 * RtlGenRandom (SystemFunction036), which every Wine has. */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T length)
{
    while (length > 0) {
        ULONG chunk = length > 0x40000000 ? 0x40000000 : (ULONG)length;
        if (!SystemFunction036(data, chunk))
            return FALSE;
        data += chunk;
        length -= chunk;
    }
    return TRUE;
}
