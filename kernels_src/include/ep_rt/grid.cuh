// Grid helpers the kernel families share: the warp size and how a channel's tokens are sliced.
#pragma once

namespace ep_rt {

constexpr int kWarpSize = 32;

// Token range [begin, end) of a channel: contiguous slices of ceil(N / C) tokens. Senders and receivers of one
// call must slice alike, so every family takes its channels' tokens from here.
__device__ __forceinline__ void channel_range(int num_tokens, int num_channels, int channel, int& begin, int& end) {
    const int per_channel = (num_tokens + num_channels - 1) / num_channels;
    begin = min(channel * per_channel, num_tokens);
    end = min(begin + per_channel, num_tokens);
}

}  // namespace ep_rt
