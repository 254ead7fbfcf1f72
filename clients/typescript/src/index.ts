export * from "./client";
// The generated protocol types. Its `ResponseError` interface (the wire shape of an
// error) is shadowed by vscode-jsonrpc's `ResponseError` class below; it stays
// reachable as `protocol.ResponseError`.
export * from "./protocol";
export * as protocol from "./protocol";
export {
  CancellationToken,
  CancellationTokenSource,
  Disposable,
  ErrorCodes,
  ResponseError,
  type Logger,
  type Message,
  type MessageConnection,
} from "vscode-jsonrpc/node";
